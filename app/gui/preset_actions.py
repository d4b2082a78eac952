"""Applying a preset: caption, emphasised panels, the engine's configuration (reconfigured between
steps, or the engine rebuilt when a construction-time field such as the KV cache size changes),
quantization, the workload and the latency budget. A part of AppController, given what it uses."""
from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from app.gui.control_state import ControllerVerbs, ControlState
from app.gui.panels import Panels
from app.gui.prepare_seen import PrepareSeen
from app.load.generator import LoadConfig
from app.talk import presets
from app.talk.compare.headline import speculation_speedup
from app.talk.compare_run import ComparisonRun, stored_result
from app.talk.panel_specs import PANEL_BY_NAME
from app.talk.talk_order import Talk, load_talk_or_files
from engine.events import SpecMethod

# switched between steps by reconfigure(); "compile" (torch.compile of the dense layers) too: its first
# steps after switching on pay for the compilation, which the step-time plot shows
SCHEDULING_KEYS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy", "compile")
SPEC_METHODS = tuple(SpecMethod)  # what a preset or the draft-length slider may switch on


class PresetActions:
    def __init__(self, window, host, panels: Panels, caption, cues, state: ControlState,
                 verbs: ControllerVerbs) -> None:
        self.window, self.host, self.panels, self.caption, self.cues = window, host, panels, caption, cues
        self.state, self.verbs = state, verbs
        # The construction-time changes a preset last asked a rebuild for. When the engine that comes back
        # still differs, that rebuild failed (the loop keeps the previous engine): say so once and carry on
        # with it, instead of asking again on every on_loaded (the endless rebuild loop of issue 12).
        self._attempted_rebuild: dict | None = None
        self.seen = PrepareSeen(window.settings if getattr(window, "persist", False) else None)

    def apply_preset(self, name_or_path: str | Path) -> bool:
        """Load, validate and apply a preset; on error say so (file:line: key: why) and change nothing."""
        try:
            preset = presets.load_preset(name_or_path, self.state.presets_dir)
        except presets.PresetError as exc:
            self.verbs.error(str(exc), title="Broken preset")
            return False
        self.state.preset = preset
        self._show_caption(preset)
        shows_comparison = preset.compare is not None and "comparison" not in preset.panels
        caps = self.state.capabilities
        attached = ("server",) if caps.server_metrics else ()  # what the server's /metrics say
        self.window.emphasise(preset.panels + attached + (("comparison",) if shows_comparison else ()))
        self._show_comparison(preset)
        self.window.setWindowTitle(f"inferlab — {preset.title}")
        self.state.config.update({k: preset.engine[k] for k in SCHEDULING_KEYS})
        self.state.config["quant_bits"] = preset.engine["quant_bits"] if caps.quantization else 16
        self.state.spec_method, self.state.config["num_speculative_tokens"] = self._spec_of(preset)
        self.state.config.update(self.state.server_point)  # a managed server keeps its point (sliders restart it)
        self.state.arrival_rate = preset.load.arrival_rate
        if hasattr(self.verbs, "live_scale"):  # the rate follows what the engine serves now (live_scale.py)
            self.verbs.live_scale.start(preset.load.arrival_rate)
        self.state.load_values = {}  # the preset's workload, until a slider moves
        self.verbs.sync_actions()
        self.panels.controls.set_values({**self.state.config, **asdict(preset.load),  # the Load generator's rows
                                         "burst_size": preset.burst_size, "ttft_budget_s": preset.ttft_s,
                                         "tpot_budget_s": preset.tpot_s, "load_running": preset.autostart})
        self.panels.latency.set_budget(preset.ttft_s, preset.tpot_s)
        self.state.budget_s = (preset.ttft_s, preset.tpot_s)  # push_config gives it to a scheduler serving it
        if self.state.engine_ready:
            self._push_preset(preset)
        self.window.show_message(f"preset: {preset.name} ({preset.path})")
        return True

    def _show_caption(self, preset: presets.Preset) -> None:
        missing = preset.unavailable(self.state.capabilities)
        text = preset.caption + "".join(f"\n⚠ Not available yet: {why}." for why in missing)
        if self.state.engine_ready and self.state.capabilities.client_timings:  # attached to a server
            text += "\n" + needs_embedded(preset, self.state.capabilities, self.state.source_name)
        info = self.host.info
        if info is not None and info.weights_origin and (preset.engine["quant_bits"] != 16 or "quant" in preset.panels):
            text += f"\nWeights: {info.weights_origin}."  # the quality figures depend on it
        self.caption.set_caption(preset.title, text)

    def _show_comparison(self, preset: presets.Preset) -> None:
        """The chapter's measured before/after at once: the stored result for this machine and model
        (from `inferlab prepare` or an earlier M), or what the chapter has not built yet."""
        panel = self.panels.comparison
        spec = preset.compare
        if spec is None or spec.not_built:
            panel.set_result({"title": spec.title, "not_built": spec.not_built} if spec else None)
            return
        try:
            result = stored_result(preset, self.host.config.model, self.host.config.num_threads)
        except OSError as exc:  # an unreadable store: say so, the preset still runs
            result = None
            self.window.show_message(f"stored comparisons could not be read: {exc}")
        seen = self.seen.note(result)
        if seen:  # another prepare wrote this store since the app last showed it
            result["store_note"] = "\n".join(filter(None, (seen, result.get("store_note"))))
            self.window.show_message(seen)
        try:
            panel.set_result(result)
            self._show_compared_speedup(result)
        except Exception as exc:  # noqa: BLE001 (the store refuses what the panel cannot read; if one gets
            # through, the preset is still applied whole and the panel says none is stored)
            panel.set_result(None)
            self.window.show_message(f"the stored comparison of {preset.name} could not be shown: {exc}")

    def measure_comparison(self, every_preset: bool = False) -> None:
        """M: run this chapter's comparison now (Load → Prepare the talk: every preset's), in the engine
        thread on engines of its own; the live load waits meanwhile and resumes after."""
        if self.state.engine_ready and not self.state.capabilities.sweep:
            self.window.show_message("measured comparisons run the embedded engine; not offered by "
                                     f"{self.state.source_name}")
            return
        if not self.host.loaded or self.state.measuring:
            self.window.show_message("the model is still loading" if not self.host.loaded
                                     else "a measurement is already running")
            return
        chosen = [presets.load_preset(n, self.state.presets_dir) for n in self.talk().names] \
            if every_preset else [self.state.preset] if self.state.preset is not None else []
        chosen = [p for p in chosen if p.compare is not None and not p.compare.not_built]
        if not chosen:
            self.window.show_message("this preset declares no comparison to measure")
            return
        self.state.measuring = True
        self.host.run_measurement(ComparisonRun(chosen, self.host.config.model))

    def on_comparison(self, preset_name: str, result: dict) -> None:
        if self.state.preset is not None and preset_name == self.state.preset.name:
            self.panels.comparison.set_result(result)
            self._show_compared_speedup(result)
        self.window.show_message(f"comparison measured: {preset_name}")

    def _show_compared_speedup(self, result: dict | None) -> None:
        """Speculation's chapters: the speed-up their comparison measured, in the speculative panel."""
        speedup = speculation_speedup(result)
        when = (result or {}).get("measured_at", "")[:10]
        self.panels.spec.set_compared_speedup(speedup, f"comparison {when}".strip())

    def _spec_of(self, preset: presets.Preset) -> tuple[str | None, int]:
        method, k = preset.engine["spec_method"], preset.engine["num_speculative_tokens"]
        if not self.state.capabilities.speculative or method not in SPEC_METHODS or not k:
            return None, 0
        if method == SpecMethod.MTP and not self.state.capabilities.mtp:
            return None, 0  # heads not trained for this model: the caption says how to train them
        return method, k

    def rebuild(self, changes: dict, knob: bool) -> None:
        """Build a new engine with changed construction-time fields; on_loaded continues."""
        if not self.state.capabilities.rebuild:
            self.verbs.error(f"{', '.join(changes)} cannot change: rebuilding the engine is not offered by "
                       f"{self.state.source_name}")
            return
        self.state.engine_ready = False
        self.state.rebuilt_for_knob = knob
        self.window.show_message("rebuilding the engine: " + ", ".join(f"{k}={v}" for k, v in changes.items()))
        self.host.reload(**changes)

    def spec_live(self) -> bool:
        """Speculation switches between steps (reconfigure) unless it needs a draft model."""
        info = self.host.info
        return (info is not None and "spec_method" in info.reconfigurable
                and self.state.spec_method in (None, SpecMethod.NGRAM))

    def _push_preset(self, preset: presets.Preset) -> None:
        wants = {"num_kv_blocks": preset.engine["num_kv_blocks"] or self.state.start_kv_blocks}
        if self.state.capabilities.lora:  # the adapter pool's slots are fixed when the engine is built
            wants["max_loras"] = preset.engine["max_loras"]
        if not self.spec_live():
            wants.update(spec_method=self.state.spec_method,
                         num_speculative_tokens=self.state.config["num_speculative_tokens"])
        wants = self._unless_failed_before(preset, wants) if self.state.capabilities.rebuild else {}
        if any(self.host.info.config.get(k) != v for k, v in wants.items()):
            self.rebuild(wants, knob=False)  # on_loaded pushes the preset again, on the new engine
            return
        self.host.cancel_measurement()
        self.host.reset()
        self.verbs.push_config()
        if self.state.config["quant_bits"] != self.state.engine_bits:
            self.host.quantize(self.state.config["quant_bits"], preset.engine["quant_group_size"])
        self.host.set_load_config(self.load_config())
        if self.state.capabilities.lora and preset.load.lora_mix:
            self.host.use_loras(preset.load.lora_mix)
        if preset.burst:
            self.host.burst(preset.burst)
        self.cues.stop()  # the new preset's cue timeline starts from 0 with its load
        self.verbs.set_load_running(preset.autostart)

    def load_config(self) -> LoadConfig:
        """The load generator's config: the preset's workload (LoadConfig() before one), the sliders' values
        over it (the arrival rate, and the other Load generator rows: state.load_values)."""
        base = self.state.preset.load if self.state.preset is not None else LoadConfig()
        return replace(base, arrival_rate=self.state.arrival_rate, **self.state.load_values)

    def _unless_failed_before(self, preset: presets.Preset, wants: dict) -> dict:
        """`wants`, or (when a rebuild for exactly these changes just failed) the engine's own values,
        after telling the user once."""
        config = self.host.info.config
        differs = {k: v for k, v in wants.items() if config.get(k) != v}
        attempted, self._attempted_rebuild = self._attempted_rebuild, (differs or None)
        if not differs or differs != attempted:
            return wants
        self._attempted_rebuild = None
        self.verbs.error(f"preset {preset.name}: rebuilding the engine with "
                   f"{', '.join(f'{k}={v}' for k, v in differs.items())} failed; keeping the previous engine "
                   "(the rest of the preset applies to it)", title="Preset not applied in full")
        return {k: config.get(k) for k in wants}

    def talk(self) -> Talk:
        """The presets in the talk's order (presets/talk.toml); a talk.toml that lies is said in one line and
        the presets go in file-name order meanwhile."""
        return load_talk_or_files(self.state.presets_dir, lambda line: self.verbs.error(line, title="Broken talk"))

    def step_preset(self, delta: int) -> None:
        """PgDown / PgUp: the next or previous chapter of the talk."""
        names = self.talk().names
        if not names:
            return
        current = self.state.preset.name if self.state.preset is not None else None
        i = names.index(current) if current in names else -delta
        self.apply_preset(names[(i + delta) % len(names)])


def needs_embedded(preset: presets.Preset, capabilities, source: str) -> str:
    """What of this preset an attached server cannot do: its panels that need the embedded engine, and
    its engine settings (the server runs with its own)."""
    gantt_only = capabilities.client_timings  # the timeline keeps its Gantt chart, timed by the client
    lacking = [what for panel in preset.panels if not (panel == "timeline" and gantt_only)
               for cap, what in PANEL_BY_NAME[panel].needs if cap not in capabilities]
    engine = ", ".join(f"{k} {preset.engine[k]}" for k in SCHEDULING_KEYS if k != "compile")
    tail = f"Its traffic runs against {source}; its engine settings ({engine}) are the server's own."
    if capabilities.restartable:  # a server inferlab started (app/managed/source.py)
        tail = (f"Its traffic runs against {source}, which inferlab started: the batch, weight-bits and draft "
                "sliders restart it with its own flags; its other engine settings are the server's own.")
    if lacking:
        return f"⚠ This preset needs the embedded engine: {'; '.join(dict.fromkeys(lacking))}: not exposed. {tail}"
    return f"Attached: this preset works on a server (per-step plots aside). {tail}"
