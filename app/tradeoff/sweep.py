"""The tradeoff sweep: batch size x weight bits x draft length, measured on the sweep's own engines.

Isolation: the sweep never touches the live engine or its listeners. It builds one engine per bits
setting from the same loaded weights (`LLMEngine(config, loaded=loaded)`), changes batch size and
draft length (n-gram speculation) with `reconfigure`, and listens to that engine only. The live
panels therefore see none of its load. Quality against the 16-bit model on the held-out text
(perplexity change, KL divergence, top-1 agreement) is measured once per bits setting and reused by
every batch and draft point of it (speculative verification is exact, batching changes no logits).

The result is plain JSON (see `run_sweep`); predicted points for larger models and GPUs come from
engine/perf/cost_model.py, calibrated on this sweep's steps, and are kept in their own list.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from app.knob_args import GROUP_SIZE
from app.load.workload import corpus_tokens
from app.source.channel import SweepDone, SweepPoint, SweepProgress
from app.tradeoff.frontier import frontiers
from app.tradeoff.sweep_point import Workload, measure_point, point_figures
from engine.config import EngineConfig
from engine.events import SpecMethod
from engine.perf.cost_model import calibrate, predicted_points
from engine.perf.roofline import Roofs, step_verdict
from engine.quant_formats import QUANT_BITS

DEFAULT_PRICE_PER_HOUR = 2.50
POINT_KEYS = ("batch", "bits", "draft")
LIVE_WAIT_S = 60.0  # the longest the sweep waits for the live requests to finish before it starts


@dataclass(frozen=True, slots=True)
class SweepSpec:
    batches: tuple[int, ...] = (1, 8, 32)
    bits: tuple[int, ...] = QUANT_BITS
    drafts: tuple[int, ...] = (0, 4)
    # weights per 4-bit scale: 64, not 32. The default model comes from a Q4_1 GGUF (32-weight blocks):
    # requantizing onto that same grid measures almost no loss (ppl -0.0004 %), which is the file's, not 4 bits'
    # (`serve` and `generate` default to the same: app/knob_args.py)
    group_size: int = GROUP_SIZE
    warmup_s: float = 1.0
    measure_s: float = 4.0
    price_per_hour: float = DEFAULT_PRICE_PER_HOUR
    memory_budget_bytes: int = 2**30  # weights + KV of each sweep engine: fewer weight bits, more KV blocks
    workload: Workload = field(default_factory=Workload)

    @property
    def num_points(self) -> int:
        return len(self.batches) * len(self.bits) * len(self.drafts)


Progress = Callable[[str, float], None]


def sweep_config(base: EngineConfig, spec: SweepSpec, bits: int) -> EngineConfig:
    """The live engine's execution settings, with the sweep's memory budget and no speculation yet."""
    return replace(base, quant_bits=bits, quant_group_size=spec.group_size, max_num_seqs=max(spec.batches),
                   spec_method=None,
                   num_speculative_tokens=0, num_kv_blocks=None, memory_budget_bytes=spec.memory_budget_bytes,
                   max_queue_len=None, max_predicted_wait_s=None, compile=False, draft_model=None,
                   draft_quant_bits=None)


def run_sweep(loaded, base: EngineConfig, spec: SweepSpec, roofs: Roofs | None, *,
              progress: Progress | None = None, on_point: Callable[[dict], None] | None = None,
              cancelled: Callable[[], bool] = lambda: False) -> dict:
    """Measure every (bits, draft, batch) point; returns {"points", "frontier", "predicted", ...}."""
    from app.tradeoff.sweep_quality import quality_pass, reference_pass
    from engine.llm_engine import LLMEngine
    from engine.quant.quality import heldout_texts

    report = progress or (lambda text, fraction: None)
    texts, corpus = heldout_texts(), corpus_tokens(loaded.tokenizer)
    order = sorted(spec.bits, key=lambda b: b != 16)  # the 16-bit engine first: the quality reference
    points, steps, reference, ppl16 = [], [], None, None
    t0 = time.perf_counter()
    for bits in order:
        if cancelled():
            break
        report(f"sweep: building the {bits}-bit engine", len(points) / spec.num_points)
        engine = LLMEngine(sweep_config(base, spec, bits), loaded=loaded)
        report(f"sweep: quality of {bits}-bit weights on the held-out text", len(points) / spec.num_points)
        if reference is None:  # the 16-bit reference (its own engine when no 16-bit point was asked for)
            ref_engine = engine if bits == 16 else LLMEngine(sweep_config(base, spec, 16), loaded=loaded)
            reference, ppl16 = reference_pass(ref_engine, texts)
            del ref_engine
        if bits == 16:
            quality = {"perplexity": ppl16, "ppl_delta_pct": 0.0, "kl": 0.0, "agreement": 1.0}
        else:
            quality = quality_pass(engine, texts, reference, ppl16)
        mem = engine.memory()
        for draft in spec.drafts:
            engine.reconfigure(spec_method=SpecMethod.NGRAM if draft else None, num_speculative_tokens=draft)
            for batch in spec.batches:
                if cancelled():
                    break
                report(f"sweep: {bits}-bit, draft {draft}, batch {batch} ({len(points) + 1}/{spec.num_points})",
                       len(points) / spec.num_points)
                engine.reconfigure(max_num_seqs=batch)
                meter = measure_point(engine, batch, corpus, spec.workload, spec.warmup_s, spec.measure_s,
                                      cancelled)
                steps.extend(meter.steps)
                point = {"batch": batch, "bits": bits, "draft": draft, "predicted": False,
                         "group_size": spec.group_size if bits != 16 else None,
                         **point_figures(meter, spec.price_per_hour), **quality,
                         "weights_bytes": mem.weights_bytes, "kv_blocks": mem.kv_blocks_total}
                points.append(point)
                if on_point is not None:
                    on_point(point)
        del engine
    return assemble(points, steps, roofs, spec, time.perf_counter() - t0)


def assemble(points: list[dict], steps: list, roofs: Roofs | None, spec: SweepSpec, seconds: float) -> dict:
    """Frontiers, calibration and predicted points around the measured ones (kept in separate lists)."""
    two, three = frontiers(points)
    eff = calibrate(roofs, steps) if roofs is not None else None
    predicted = predicted_points(eff, spec.price_per_hour) if eff is not None else []
    keys = lambda idx: [{k: points[i][k] for k in POINT_KEYS} for i in idx]  # noqa: E731
    for i, p in enumerate(points):
        p["on_frontier"] = i in two
    return {
        "points": points, "frontier": keys(two), "frontier_with_quality": keys(three), "predicted": predicted,
        "calibration": None if eff is None else {"efficiency_memory": eff.memory,
                                                 "efficiency_compute": eff.compute,
                                                 "decode_steps": eff.decode_steps,
                                                 "prefill_steps": eff.prefill_steps},
        "roofline": None if roofs is None else {**roofs.to_dict(), "steps": verdict_summary(roofs, steps)},
        "machine": None if roofs is None else roofs.machine,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sweep_seconds": seconds, "price_per_hour": spec.price_per_hour,
        "spec": {"batches": list(spec.batches), "bits": list(spec.bits), "drafts": list(spec.drafts),
                 "warmup_s": spec.warmup_s, "measure_s": spec.measure_s,
                 "memory_budget_bytes": spec.memory_budget_bytes,
                 "prompt_tokens": list(spec.workload.prompt_tokens),
                 "output_tokens": list(spec.workload.output_tokens), "seed": spec.workload.seed,
                 "draft_method": "ngram"},
    }


def verdict_summary(roofs: Roofs, steps: list) -> dict:
    """Per kind of step: how many were compute-, memory- or overhead-bound, and the median fraction of
    the bounding roof they reached."""
    out: dict[str, dict] = {}
    for kind in ("prefill", "decode"):
        verdicts = [v for k, f, b, w in steps if k == kind and (v := step_verdict(roofs, f, b, w)) is not None]
        if not verdicts:
            continue
        counts = {bound: sum(v.bound == bound for v in verdicts)
                  for bound in ("compute-bound", "memory-bound", "overhead-bound")}
        fractions = sorted(v.fraction for v in verdicts)
        intensities = sorted(v.intensity for v in verdicts)
        out[kind] = {"steps": len(verdicts), **counts, "median_fraction_of_roof": fractions[len(fractions) // 2],
                     "median_intensity_flops_per_byte": intensities[len(intensities) // 2],
                     "verdict": max(counts, key=counts.get)}
    return out


class Sweep:
    """The GUI's sweep, run in the engine thread as Sweep(spec)(host). The live engine waits meanwhile:
    its load generator is stopped and the requests it holds are let finish first (at most LIVE_WAIT_S;
    any left pause, never aborted, and the progress line says so); the sweep's own engines publish
    nothing to the live panels. Progress and results go out on the host's channel (app/source/channel.py):
    SweepProgress(text, fraction), SweepPoint(dict), SweepDone(result)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec

    def __call__(self, host) -> None:
        from app.tradeoff.live_wait import finish_live_requests
        from engine.loading.loader import load_model
        from engine.perf.probe import probe_roofs

        was_running = host.loadgen.running
        host.loadgen.stop()
        result = None
        try:
            left = finish_live_requests(host, LIVE_WAIT_S, lambda text: host.publish(SweepProgress(text, 0.0)))
            if left:
                host.publish(SweepProgress(f"sweep: {left} live requests pause until the sweep is done", 0.0))
            loaded = load_model(host.engine.config.model)
            roofs = probe_roofs(host.engine.device)
            result = run_sweep(loaded, host.engine.config, self.spec, roofs,
                               progress=lambda t, f: host.publish(SweepProgress(t, f)),
                               on_point=lambda p: host.publish(SweepPoint(p)),
                               cancelled=lambda: host.stopping or host.measurement_cancelled.is_set())
            result["model"] = host.engine.model_path
            from app.tradeoff.sweep_store import save

            save(result, roofs.machine, host.engine.model_path)  # kept for the next start
        finally:
            if was_running and not (host.stopping or host.measurement_cancelled.is_set()):
                host.loadgen.start(time.perf_counter())
            host.publish(SweepDone(result))
