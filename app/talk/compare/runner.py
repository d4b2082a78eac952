"""The comparison runner: one seeded workload, run under each configuration of a preset's [compare].

    result = run_comparison(spec, loaded, EngineConfig(...), slo=SLO(...), progress=fn, cancelled=fn)

Each configuration runs on an engine of its own, built from the same loaded weights
(`LLMEngine(cfg, loaded=loaded)`); consecutive configurations that differ only in run-time knobs share
one engine through `reconfigure`. With `rounds = N` the configurations run in turn N times (later rounds
with the short warm-up) and each figure is the median of its rounds. No live engine and none of its
listeners is touched, so the live panels never see this load; the app runs the callable in its engine
thread with the live load paused.
"""
from __future__ import annotations

import gc
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from app.load.generator import corpus_text
from app.talk.compare.adapters import ensure_adapters
from app.talk.compare.capacity import Capacity, capacity_label, measure_capacity
from app.talk.compare.collect import RunRecord
from app.talk.compare.computed import contiguous_reservation
from app.talk.compare.drive import Cancelled, Driver
from app.talk.compare.kinds import RateUnit, RunMode, Warmup
from app.talk.compare.knee import knee_label, measure_knee
from app.talk.compare.machine import machine_info
from app.talk.compare.metrics import bandwidth_metrics, request_split, run_metrics
from app.talk.compare.metrics_catalog import METRICS
from app.talk.compare.probe import probe_bandwidth
from app.talk.compare.quality import QUALITY, QualityMeter
from app.talk.compare.spec import KNEE_KNOB, WORKLOAD_KNOBS, CompareSpec, ConfigSpec
from app.talk.compare.workload import plan
from engine.config import EngineConfig
from engine.core.metrics import SLO
from engine.events import SpecMethod
from engine.llm_engine import LLMEngine

Progress = Callable[[str, float], None]
BANDWIDTH = ("bytes_per_decode_step", "achieved_gb_per_s", "probe_gb_per_s", "predicted_decode_tokens_per_s")
__all__ = ["Cancelled", "run_comparison"]


class _Engines:
    """Builds engines from the loaded weights; reuses the current one when only run-time knobs change."""

    def __init__(self, loaded, base: EngineConfig) -> None:
        self.loaded, self.base = loaded, base
        self.engine: LLMEngine | None = None
        self.key: tuple | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None

    def scratch(self) -> Path:
        """A folder for files the run makes (random LoRA adapters), removed when the run ends."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="inferlab-compare-")
        return Path(self._scratch.name)

    @staticmethod
    def _build_key(cfg: EngineConfig) -> tuple:
        fixed = [(k, v) for k, v in cfg.knob_values().items() if k not in LLMEngine.RECONFIGURABLE]
        if cfg.spec_method not in (None, SpecMethod.NGRAM):  # a draft model or MTP heads load only at start-up
            fixed.append(("spec_method", cfg.spec_method))
        return tuple(fixed)

    def get(self, cfg: EngineConfig) -> tuple[LLMEngine, bool]:
        """(engine, built): an engine running `cfg`."""
        key = self._build_key(cfg)
        if self.engine is not None and key == self.key:
            self.engine.reconfigure(**{k: getattr(cfg, k) for k in LLMEngine.RECONFIGURABLE})
            return self.engine, False
        self.engine = self.key = None
        gc.collect()  # the previous engine's KV cache goes before the next one takes its own
        self.engine, self.key = LLMEngine(cfg, loaded=self.loaded), key
        return self.engine, True

    def close(self) -> None:
        self.engine = self.key = None
        gc.collect()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def _engine_config(base: EngineConfig, spec: CompareSpec, c: ConfigSpec) -> EngineConfig:
    knobs = {**spec.engine, **{k: v for k, v in c.knobs.items() if k not in WORKLOAD_KNOBS and k != KNEE_KNOB}}
    if c.mode == RunMode.RECOMPUTE:
        knobs["enable_prefix_caching"] = False  # a cached prefix would be a KV cache by another name
    return replace(base, **knobs)


def _warm_up(engine: LLMEngine, spec: CompareSpec, planned, corpus, cancelled, loras: tuple[str, ...] = ()) -> float:
    """An untimed run before the timed one (first-call costs: kernels, allocator, compiling). "short":
    one small request; "workload": the whole workload with other prompts of the same lengths."""
    w = spec.workload
    t0 = time.perf_counter()
    if w.warmup == Warmup.WORKLOAD:
        others = plan(replace(w, seed=w.seed + 1000), corpus, engine.max_model_len)
        Driver(engine, RunRecord(), cancelled, "warm", loras=loras).run(
            RunMode.CONTINUOUS, [replace(p, at_unit=0.0) for p in others], 1.0)
    else:
        first = [replace(p, at_unit=0.0, max_tokens=min(4, p.max_tokens)) for p in planned[: max(1, len(loras))]]
        Driver(engine, RunRecord(), cancelled, "warm", loras=loras).run(RunMode.CONTINUOUS, first, 1.0)
    engine.block_manager.reset_prefix_cache()  # the timed run starts with a cold prefix cache
    return time.perf_counter() - t0


def _measure(engine: LLMEngine, spec: CompareSpec, c: ConfigSpec, planned, tag: str, slo, cancelled,
             loras: tuple[str, ...] = (), rate_per_unit: float = 1.0) -> tuple:
    mem = engine.memory()
    rec = RunRecord(kv_bytes_per_token=mem.kv_block_bytes / engine.config.block_size)
    hits0, steps0 = engine.stats().num_prefix_cache_hit_tokens, engine.stats().num_steps
    pool0 = engine.lora.snapshot() if engine.lora is not None else None
    rate = float(c.knobs.get("rate", spec.workload.rate)) * rate_per_unit
    Driver(engine, rec, cancelled, tag, spec.workload.stop, loras).run(c.mode, planned, rate)
    outputs = sum(len(t) for t in rec.token_ids.values())
    m = run_metrics(rec, slo, outputs)
    if c.mode == RunMode.RECOMPUTE:  # each one-token request recomputed the tokens before it
        m["tokens_computed_per_output_token"] = (sum(s.num_tokens for s in rec.steps)) / max(outputs, 1)
    mem = engine.memory()
    m.update(weights_bytes=mem.weights_bytes, kv_blocks=mem.kv_blocks_total,
             kv_bytes_peak=m["kv_blocks_peak"] * mem.kv_block_bytes,
             prefix_cache_saved_tokens=engine.stats().num_prefix_cache_hit_tokens - hits0,
             steps=engine.stats().num_steps - steps0, adapters_in_mix=len(loras))
    if pool0 is not None:
        pool1 = engine.lora.snapshot()
        m.update(adapter_loads=pool1.num_loads - pool0.num_loads,
                 adapter_evictions=pool1.num_evictions - pool0.num_evictions)
    return m, rec


def _same_output(first: dict, rec: RunRecord, tag: str, first_tag: str) -> float | None:
    common = [k for k in first if k.replace(first_tag, tag, 1) in rec.token_ids]
    if not common:
        return None
    same = sum(first[k] == rec.token_ids[k.replace(first_tag, tag, 1)] for k in common)
    return 100.0 * same / len(common)


def run_comparison(spec: CompareSpec, loaded, base: EngineConfig, *, slo: SLO | None = None,
                   progress: Progress | None = None, cancelled: Callable[[], bool] | None = None) -> dict:
    """Run every configuration of `spec`; returns the result dict (see module doc of app/talk/compare/store.py).
    Raises Cancelled when `cancelled()` turns true (between steps)."""
    progress = progress or (lambda text, fraction: None)
    cancelled = cancelled or (lambda: False)
    result = {"title": spec.title, "knob": spec.knob, "metrics": list(spec.metrics), "chart": list(spec.chart),
              "headline": spec.headline if spec.metrics else None,
              "metric_info": {m: METRICS[m] for m in spec.metrics}, "workload": asdict(spec.workload),
              "fingerprint": spec.fingerprint(), "machine": machine_info(base.device),
              "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "comparison": []}
    if spec.not_built:
        result["not_built"] = spec.not_built
        return result
    corpus = loaded.tokenizer.encode(corpus_text(), add_special_tokens=False)
    probe = None  # measured once, on the device of the first engine
    engines, quality = _Engines(loaded, base), QualityMeter()
    n = len(spec.configs)
    try:
        capacity = None
        if spec.workload.rate_unit == RateUnit.CAPACITY:
            progress(f"{spec.title}: measuring this machine's capacity", 0.0)
            capacity = _capacity(spec, engines, corpus, slo, cancelled)
            result["capacity"] = capacity.as_dict()
            spec = replace(spec, workload=replace(spec.workload, requests=capacity.requests))
        knee_multiples = [c.knobs.get(KNEE_KNOB) for c in spec.configs]
        if any(m is not None for m in knee_multiples):  # batch sizes from this machine's roofline
            progress(f"{spec.title}: the roofline's knee (memory vs compute)", 0.0)
            spec, knee = _at_knee(spec, base)
            result["knee"], result["regime"] = knee.as_dict(), knee.regime()
        served = [_requests_served(spec, c, base) for c in spec.configs]
        planned = plan(replace(spec.workload, requests=max(served)), corpus,
                       min(loaded.config.max_position_embeddings, 2048))
        rounds = spec.workload.rounds
        by_config: list[list[dict]] = [[] for _ in spec.configs]
        for r in range(rounds):
            first_tokens, first_tag, last = None, "", None
            for i, c in enumerate(spec.configs):
                if cancelled():
                    raise Cancelled()
                step = r * n + i
                of_rounds = f", round {r + 1}/{rounds}" if rounds > 1 else ""
                progress(f"{spec.title}: {c.label} ({i + 1}/{n}{of_rounds})", step / (n * rounds))
                if c.mode == RunMode.CONTIGUOUS:
                    by_config[i].append(contiguous_reservation(c, last, spec.metrics))
                    continue
                # later rounds: the configuration's first-call costs (compiling) were paid in the first
                entry, last_rec, engine = _run_one(spec, c, i, engines, planned[: served[i]], corpus, slo, cancelled,
                                                   capacity, warmup=None if r == 0 else "short")
                if first_tokens is None:
                    first_tokens, first_tag = dict(last_rec.token_ids), f"c{i}"
                entry["metrics"]["same_output_as_first_pct"] = _same_output(first_tokens, last_rec, f"c{i}", first_tag)
                if any(m in BANDWIDTH for m in spec.metrics):
                    probe = probe or probe_bandwidth(str(engine.device))
                    mem = engine.memory()  # one copy of the weights is read per step (packed or not)
                    weights_read = mem.weights_bytes - mem.packed_weights_bytes
                    entry["metrics"].update(bandwidth_metrics(last_rec, weights_read, probe))
                if r == 0 and any(m in QUALITY for m in spec.metrics):  # the weights', not the round's: once
                    progress(f"{spec.title}: {c.label}: quality on held-out text", (step + 0.8) / (n * rounds))
                    entry["metrics"].update(quality.measure(engine))
                if c.mode == RunMode.CONTINUOUS:  # what a computed counterfactual is computed from
                    last = (entry, last_rec, engine.max_model_len, engine.config.block_size,
                            engine.memory().kv_block_bytes)
                entry["metrics"] = _keep(entry["metrics"], spec.metrics)
                by_config[i].append(entry)
        result["comparison"] = [_median_of_rounds(entries) for entries in by_config]
        for row, multiple in zip(result["comparison"], knee_multiples):
            if multiple is not None:  # "1x knee" is what the preset's checks name it by
                row["spec_label"], row["label"] = row["label"], knee_label(row["config"]["max_num_seqs"], multiple)
        if rounds > 1:
            result["rounds"] = rounds
    finally:
        engines.close()
    progress(f"{spec.title}: done", 1.0)
    return result


def _at_knee(spec: CompareSpec, base: EngineConfig):
    """`spec` with each knee multiple made a batch size (max_num_seqs) on this machine, and the knee."""
    import torch

    device = torch.device("cuda" if str(base.device) != "cpu" and torch.cuda.is_available() else "cpu")
    knee = measure_knee(device, "bfloat16" if base.dtype == "auto" else str(base.dtype))
    configs = tuple(replace(c, knobs={**{k: v for k, v in c.knobs.items() if k != KNEE_KNOB},
                                      "max_num_seqs": knee.batch_for(c.knobs[KNEE_KNOB])})
                    if KNEE_KNOB in c.knobs else c for c in spec.configs)
    return replace(spec, configs=configs), knee


def _requests_served(spec: CompareSpec, c: ConfigSpec, base: EngineConfig) -> int:
    """The workload's requests, or requests_per_batch x the configuration's batch where that is more."""
    batch = c.knobs.get("max_num_seqs", spec.engine.get("max_num_seqs", base.max_num_seqs))
    return max(spec.workload.requests, spec.workload.requests_per_batch * int(batch))


def _capacity(spec: CompareSpec, engines: _Engines, corpus, slo, cancelled) -> Capacity:
    """The first configuration's engine, warmed up and timed on an all-at-once workload (capacity.py)."""
    engine, _ = engines.get(_engine_config(engines.base, spec, spec.configs[0]))
    return measure_capacity(engine, spec.workload, corpus, slo.ttft_s if slo else 0.0, cancelled)


def _run_one(spec, c: ConfigSpec, i: int, engines: _Engines, planned, corpus, slo, cancelled,
             capacity: Capacity | None = None, warmup: str | None = None):
    cfg = _engine_config(engines.base, spec, c)
    label, note = c.label, None
    try:
        engine, _ = engines.get(cfg)
    except ValueError as exc:
        if cfg.spec_method != SpecMethod.MTP:
            raise
        # no MTP heads for this model: compare n-gram speculation instead, and say so
        engine, _ = engines.get(replace(cfg, spec_method=SpecMethod.NGRAM))
        label, note = f"{c.label} → n-gram (no MTP heads)", f"multi-token heads are missing ({exc}); n-gram ran instead"
    loras, random_ones = (), 0
    if c.knobs.get("adapters"):
        loras, random_ones = ensure_adapters(engine, int(c.knobs["adapters"]), engines.scratch())
    if warmup is not None:
        spec = replace(spec, workload=replace(spec.workload, warmup=warmup))
    warm = _warm_up(engine, spec, planned, corpus, cancelled, loras)
    per_unit = capacity.requests_per_s if capacity is not None else 1.0
    metrics, rec = _measure(engine, spec, c, planned, f"c{i}", slo, cancelled, loras, per_unit)
    if random_ones:
        note = (f"{random_ones} of the {len(loras)} adapters are random ones of the same rank and targets as the "
                "trained ones: the cost of mixing is measured, not their answers")
    metrics["warmup_s"] = warm
    streamed = c.knobs.get("streamed", True)  # the first text a user sees: a token streamed, else the answer
    for q in ("p50", "p99"):
        metrics[f"{q}_first_text_ms"] = metrics.get(f"{q}_ttft_ms" if streamed else f"{q}_e2e_ms")
    entry = {"label": label, "config": {"mode": c.mode, **c.knobs}, "metrics": metrics}
    if capacity is not None and "rate" in c.knobs:  # the rate knob counts in capacities: say it in requests/s too
        rate_per_s = c.knobs["rate"] * capacity.requests_per_s
        # a knob sweep's "rate = 2.0" becomes "2x capacity (4.9/s)"; a label the preset wrote keeps its words
        swept = spec.knob == "rate" and c.label.startswith("rate = ")
        entry["label"] = capacity_label(c.knobs["rate"], capacity) if swept else f"{label} ({rate_per_s:.2g}/s)"
        entry["spec_label"] = c.label  # what the preset's checks name it by
        entry["config"]["rate_per_s"] = rate_per_s
    if "p50_queue_ms" in spec.metrics:  # each request's time split, for the latency-budget chart
        entry["requests"] = request_split(rec)
    if note:
        entry["note"] = note
    return entry, rec, engine


def _median_of_rounds(entries: list[dict]) -> dict:
    """One configuration's entry over its rounds: the last round's, each figure the median of the rounds
    (`by_round` keeps them all), warmup_s the first round's (the one that paid the first-call costs)."""
    if len(entries) == 1:
        return entries[0]
    out = dict(entries[-1])
    metrics, by_round = {}, {}
    for name in dict.fromkeys(k for e in entries for k in e["metrics"]):  # quality: the first round's only
        values = [e["metrics"][name] for e in entries if name in e["metrics"]]
        if name == "warmup_s":
            metrics[name] = entries[0]["metrics"].get(name, values[0])
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            metrics[name] = statistics.median(values)
            by_round[name] = values
        else:
            metrics[name] = values[-1]
    out["metrics"], out["by_round"] = metrics, by_round
    return out


def _keep(metrics: dict, names) -> dict:
    """Only the metrics the spec asked for, as plain finite numbers (None and NaN dropped)."""
    out = {}
    for k in names:
        v = metrics.get(k)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out[k] = float(v) if isinstance(v, float) else int(v) if isinstance(v, int) else v
    return out
