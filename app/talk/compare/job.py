"""The app's entry point: run one preset's comparison in the engine thread and store it.

    job = ComparisonJob(preset, model_name)       # app.talk.presets.Preset with a [compare] section
    result = job(loaded, base_config, progress, cancelled)   # in the engine thread, live load paused
    panel.set_result(result)                      # on the GUI thread (widgets/comparison.py)

`loaded` is the LoadedModel the live engine was built from (engine.loading.loader.load_model): the
comparison engines share its weights and never the live engine itself, so the live panels see none
of this load. On opening a preset, `load_stored(preset.name, model_name, fingerprint=...)` gives the
stored result at once, without running anything."""
from __future__ import annotations

from collections.abc import Callable

from app.talk.compare.runner import run_comparison
from app.talk.compare.store import load_stored, save_result
from engine.config import EngineConfig
from engine.core.metrics import SLO

KV_CACHE_BYTES = 128 * 2**20  # per comparison engine: ample for the small workloads, several engines fit


def comparison_base(model: str, dtype: str = "auto", device: str = "auto", threads: int | None = None) -> EngineConfig:
    """The configuration every comparison starts from, in `inferlab prepare` and in the app alike (its
    [compare] section then sets the knobs it compares), so a prepared result is the one the app shows."""
    return EngineConfig(model=model, dtype=dtype, device=device, num_threads=threads,
                        kv_cache_memory_bytes=KV_CACHE_BYTES)


class ComparisonJob:
    def __init__(self, preset, model: str) -> None:
        if preset.compare is None:
            raise ValueError(f"preset {preset.name!r} has no [compare] section")
        self.preset, self.model = preset, model

    def stored(self) -> dict | None:
        """The stored result for this machine, model and the preset's current [compare] section."""
        return load_stored(self.preset.name, self.model, fingerprint=self.preset.compare.fingerprint())

    def __call__(self, loaded, base: EngineConfig, progress: Callable[[str, float], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> dict:
        from app.talk.compare.prepare_chapter import dtype_conditions, run_with_checks

        def run(spec) -> dict:
            return run_comparison(spec, loaded, base, slo=SLO(self.preset.ttft_s, self.preset.tpot_s),
                                  progress=progress, cancelled=cancelled)

        # the chapter's claims are checked here too (no fallback: the speaker chose to measure this one)
        result = run_with_checks(self.preset.compare, run, {**dtype_conditions(base.dtype, str(base.device)),
                                                            "threads": base.num_threads})
        save_result(self.preset.name, self.model, result)
        return result
