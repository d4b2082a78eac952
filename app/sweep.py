"""The tradeoff sweep: a small grid over max batch size, measured on a saturating workload.

Runs inside the engine thread (EngineHost.run_sweep), so the window keeps painting: every step of the
sweep flows to the panels like any other. For each batch size it keeps `2 x batch` requests in flight
(closed loop, so the engine is always full), waits out a warm-up, then measures for the rest of the
point. Afterwards the previous configuration is restored and the load generator resumes if it ran.
Progress and points go out through the host's event channel (app/channel.py):
  SweepProgress(text, fraction), SweepPoint(TradeoffPoint), SweepDone(points, cancelled).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.channel import SweepDone, SweepPoint, SweepProgress
from app.load.generator import LoadConfig, LoadGenerator
from app.tradeoff_meter import RateMeter, config_label, make_point

DEFAULT_GRID = (1, 4, 16, 64)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    grid: tuple[int, ...] = DEFAULT_GRID
    seconds_per_point: float = 4.0
    warmup_share: float = 0.25
    load: LoadConfig = field(default_factory=lambda: LoadConfig(prompt_tokens=(32, 128), output_tokens=(32, 96),
                                                                ignore_eos=True))
    seed: int = 1234


class Sweep:
    """Callable run by the engine thread: Sweep(spec)(host)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec

    def __call__(self, host) -> None:
        engine, spec = host.engine, self.spec
        before = {"max_num_seqs": engine.config.max_num_seqs}
        was_running = host.loadgen.running
        host.loadgen.stop()
        host.abort_all(only_ours=True)  # in-flight load would blur the first point
        points, cancelled = [], False
        try:
            for i, batch in enumerate(spec.grid):
                if host.stopping or host.sweep_cancelled.is_set():
                    cancelled = True
                    break
                host.publish(SweepProgress(f"sweep: max batch size {batch} ({i + 1}/{len(spec.grid)})",
                                           i / len(spec.grid)))
                point = self._measure(host, batch, i)
                if point is not None:
                    points.append(point)
                    host.publish(SweepPoint(point))
        finally:
            host.abort_all(only_ours=True)
            engine.reconfigure(**before)
            if was_running and not (host.stopping or host.sweep_cancelled.is_set()):
                host.loadgen.start(time.perf_counter())
            host.publish(SweepDone(len(points), cancelled))

    def _measure(self, host, batch: int, index: int):
        engine, spec = host.engine, self.spec
        engine.reconfigure(max_num_seqs=batch)
        gen = LoadGenerator(spec.load, corpus_ids=host.loadgen.corpus_ids, rng_seed=spec.seed,
                            max_model_len=engine.max_model_len)
        meter = RateMeter()
        engine.add_listener(meter.add)
        t0 = time.perf_counter()
        warm_until = t0 + spec.warmup_share * spec.seconds_per_point
        end = t0 + spec.seconds_per_point
        warm, shown = False, 0.0
        try:
            while (now := time.perf_counter()) < end and not host.stopping and not host.sweep_cancelled.is_set():
                if not warm and now >= warm_until:
                    meter.reset()
                    warm = True
                in_flight = len(host.live_request_ids)
                for _ in range(max(0, 2 * batch - in_flight)):
                    host.submit(gen.make_arrival())
                engine.step()
                if now - shown > 0.2:
                    shown = now
                    host.publish(SweepProgress(f"sweep: max batch size {batch} ({index + 1}/{len(spec.grid)})",
                                               (index + (now - t0) / spec.seconds_per_point) / len(spec.grid)))
        finally:
            engine.remove_listener(meter.add)
        host.abort_all(only_ours=True)
        config = {"max_num_seqs": batch, "max_num_batched_tokens": engine.config.max_num_batched_tokens,
                  "quant_bits": engine.config.quant_bits}
        return make_point("sweep: " + config_label(config), config, meter, host.perplexity)
