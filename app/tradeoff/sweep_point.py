"""Measure one sweep point: a saturating, seeded closed loop on the sweep's own engine.

`batch` requests are kept in flight (a finished one is replaced at once), so every step runs a full
batch. The warm-up lasts `warmup_s` and until every request of the first batch has been admitted (no
one waiting); then the step events of the sweep engine's own listener are summed for `measure_s`
and at least MIN_STEPS steps (a slow or busy machine takes longer rather than measuring nothing), up
to MAX_POINT_FACTOR x (warmup_s + measure_s) in all:

    total tokens/s     = generated tokens / window time (first measured step start -> last step end)
    tokens/s per user  = total tokens/s / the time-weighted mean of running requests (each user's share)
    TTFT, TPOT         = p50 / p99 over the requests that finished in the window (engine timestamps)

Each step's counted FLOPs and bytes (StepStats) give the efficiency against the probed roofs, which
calibrates the cost model (engine/perf/cost_model.py).
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from engine.drive import drive
from engine.events import EngineStepEvent
from engine.sampling_params import SamplingParams

MIN_STEPS = 5
MAX_POINT_FACTOR = 6


@dataclass(frozen=True, slots=True)
class Workload:
    prompt_tokens: tuple[int, int] = (32, 96)
    output_tokens: tuple[int, int] = (8, 32)
    seed: int = 1234


@dataclass(slots=True)
class PointMeter:
    """Listener on the sweep engine: sums step events once `measuring` is set."""

    measuring: bool = False
    generated: int = 0
    t_first: float | None = None
    t_last: float = 0.0
    running_time: float = 0.0  # sum of running requests x step wall time
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    steps: list = field(default_factory=list)  # (kind, flops, bytes, wall) of measured steps
    num_waiting: int = -1  # after the latest step (measured or not)

    def __call__(self, event: EngineStepEvent) -> None:
        s = event.stats
        self.num_waiting = s.num_waiting
        if not self.measuring:
            return
        self.t_first = s.t_start if self.t_first is None else self.t_first
        self.t_last = s.t_start + s.wall_time_s
        self.generated += sum(len(o.new_token_ids) for o in event.outputs)
        self.running_time += s.num_running * s.wall_time_s
        kind = "prefill" if s.num_prefill_tokens else "decode"
        self.steps.append((kind, s.flops, s.bytes_moved, s.wall_time_s))
        for tl in event.finished:
            if tl.ttft is not None:
                self.ttft.append(tl.ttft)
            if tl.tpot is not None:
                self.tpot.append(tl.tpot)


def percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0] * 1e3
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1e3


def _make_request(engine, rng: random.Random, corpus: list[int], wl: Workload) -> None:
    n = rng.randint(*wl.prompt_tokens)
    start = rng.randrange(0, max(1, len(corpus) - n))
    params = SamplingParams(max_tokens=rng.randint(*wl.output_tokens), temperature=0.0, ignore_eos=True)
    engine.add_request(corpus[start : start + n], params)


def measure_point(engine, batch: int, corpus: list[int], wl: Workload, warmup_s: float, measure_s: float,
                  cancelled=lambda: False) -> PointMeter:
    """Run the closed loop on `engine` (already reconfigured) and return the filled meter."""
    rng = random.Random(wl.seed)
    meter = PointMeter()
    engine.add_listener(meter)
    live: set[str] = set()
    track = _Tracker(live)
    engine.add_listener(track)
    t0 = time.perf_counter()
    t_measure = None

    def window_over() -> bool:
        """Warm-up, then the measuring window (opened once the queue is empty), or the time cap."""
        nonlocal t_measure
        now = time.perf_counter()
        if now - t0 >= MAX_POINT_FACTOR * (warmup_s + measure_s):
            return True
        if t_measure is None and now - t0 >= warmup_s and meter.num_waiting == 0:
            t_measure, meter.measuring = now, True
        return t_measure is not None and now - t_measure >= measure_s and len(meter.steps) >= MIN_STEPS

    def top_up() -> None:  # the closed loop: `batch` requests live or queued at every step
        for _ in range(batch - len(live) - track.pending):
            _make_request(engine, rng, corpus, wl)
            track.pending += 1

    try:
        drive(engine, until=lambda: cancelled() or window_over(), before_step=top_up)
    finally:
        meter.measuring = False
        _drain(engine, live, track)
        engine.remove_listener(meter)
        engine.remove_listener(track)
    return meter


class _Tracker:
    """Which requests are live on the sweep engine (arrived and not finished)."""

    def __init__(self, live: set[str]) -> None:
        self.live, self.pending = live, 0

    def __call__(self, event: EngineStepEvent) -> None:
        for rid, _t, _n in event.arrived:
            self.live.add(rid)
            self.pending -= 1
        for tl in event.finished:
            self.live.discard(tl.request_id)


def _drain(engine, live: set[str], track: _Tracker) -> None:
    """Abort what is left so the next point starts from an empty engine."""
    if track.pending:
        drive(engine, max_steps=1)  # requests still in the queue arrive first
    for rid in list(live):
        engine.abort(rid)
    drive(engine)


def point_figures(meter: PointMeter, price_per_hour: float) -> dict:
    window = meter.t_last - meter.t_first if meter.t_first is not None else 0.0
    total = meter.generated / window if window > 0 else 0.0
    mean_running = meter.running_time / window if window > 0 else 0.0
    per_user = total / mean_running if mean_running > 0 else 0.0
    usd = price_per_hour / (total * 3600.0) * 1e6 if total > 0 else None
    return {"tokens_per_s_user": per_user, "tokens_per_s_total": total, "usd_per_mtok": usd,
            "p50_ttft_ms": percentile_ms(meter.ttft, 50), "p99_ttft_ms": percentile_ms(meter.ttft, 99),
            "p50_tpot_ms": percentile_ms(meter.tpot, 50), "p99_tpot_ms": percentile_ms(meter.tpot, 99),
            "finished_requests": len(meter.tpot), "measured_s": window, "generated_tokens": meter.generated,
            "mean_running": mean_running}
