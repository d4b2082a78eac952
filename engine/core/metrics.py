"""Latency budget: per-request timings, percentiles, SLO targets and goodput (pure Python, no torch).

Every number here is measured: it comes from the RequestTimeline the engine publishes when a request
ends (perf_counter stamps taken in the engine thread).

    queue    arrival -> first scheduled          (waiting for a seat and token budget)
    prefill  first scheduled -> first token      (the prompt's forward passes, chunks included)
    decode   first token -> finished
    TTFT     arrival -> first token  = queue + prefill
    TPOT     decode / (output tokens - 1)        (time per output token after the first)
    e2e      arrival -> finished
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.events import RequestTimeline

PERCENTILES = (50.0, 95.0, 99.0)
COMPLETED = ("stop", "length")  # finish reasons of requests that ran to their end


@dataclass(frozen=True, slots=True)
class RequestTimings:
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None
    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    ttft_s: float | None
    tpot_s: float | None  # None with fewer than two output tokens
    e2e_s: float | None


def request_timings(tl: RequestTimeline) -> RequestTimings:
    prefill = None if tl.first_token is None or tl.first_scheduled is None else tl.first_token - tl.first_scheduled
    decode = None if tl.finished is None or tl.first_token is None else tl.finished - tl.first_token
    return RequestTimings(tl.request_id, tl.num_prompt_tokens, tl.num_output_tokens, tl.finish_reason,
                          tl.queue_time, prefill, decode, tl.ttft, tl.tpot, tl.e2e)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def percentiles(values: Iterable[float | None], ps: Sequence[float] = PERCENTILES) -> dict[str, float | None]:
    """{"p50": ..., "p95": ..., "p99": ...} over the values that are not None."""
    xs = [v for v in values if v is not None]
    return {f"p{p:g}": percentile(xs, p) for p in ps}


@dataclass(frozen=True, slots=True)
class SLO:
    """A latency budget: TTFT and TPOT targets, judged at `percentile` over a run.

    One request *meets the budget* when its own TTFT and TPOT are within the targets (TPOT is not
    judged for requests with a single output token). Goodput counts only those requests.
    """

    ttft_s: float
    tpot_s: float
    percentile: float = 99.0

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and 0 < self.percentile <= 100):
            raise ValueError(f"SLO targets must be > 0 and the percentile in (0, 100], got {self}")

    def met_by(self, t: RequestTimings) -> bool:
        if t.finish_reason not in COMPLETED or t.ttft_s is None or t.ttft_s > self.ttft_s:
            return False
        return t.tpot_s is None or t.tpot_s <= self.tpot_s


@dataclass(frozen=True, slots=True)
class LatencyReport:
    """A run judged against an SLO. Rates divide by `duration_s`, the wall time of the run."""

    num_requests: int
    num_completed: int
    num_met_slo: int
    duration_s: float
    throughput_rps: float  # completed requests per second
    goodput_rps: float  # requests per second that met the budget
    ttft: dict[str, float | None]
    tpot: dict[str, float | None]
    e2e: dict[str, float | None]
    queue: dict[str, float | None]
    prefill: dict[str, float | None]
    decode: dict[str, float | None]
    slo: SLO | None = None
    ttft_at_slo_percentile: float | None = None
    tpot_at_slo_percentile: float | None = None

    @property
    def slo_attainment(self) -> float:
        """Share of requests that met the budget."""
        return self.num_met_slo / self.num_requests if self.num_requests else 0.0

    @property
    def meets_slo(self) -> bool:
        """True when TTFT and TPOT at the SLO's percentile are within their targets."""
        if self.slo is None or self.ttft_at_slo_percentile is None:
            return False
        tpot_ok = self.tpot_at_slo_percentile is None or self.tpot_at_slo_percentile <= self.slo.tpot_s
        return self.ttft_at_slo_percentile <= self.slo.ttft_s and tpot_ok

    def as_dict(self) -> dict:
        d = {name: getattr(self, name) for name in self.__slots__ if name != "slo"}
        d["slo"] = None if self.slo is None else {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s,
                                                   "percentile": self.slo.percentile}
        d["slo_attainment"] = self.slo_attainment
        d["meets_slo"] = self.meets_slo
        return d


def latency_report(timings: Sequence[RequestTimings], duration_s: float, slo: SLO | None = None,
                   ps: Sequence[float] = PERCENTILES) -> LatencyReport:
    done = [t for t in timings if t.finish_reason in COMPLETED]
    met = sum(slo.met_by(t) for t in timings) if slo else 0
    dur = max(duration_s, 1e-9)

    def pct(field: str) -> dict[str, float | None]:
        return percentiles((getattr(t, field) for t in done), ps)

    return LatencyReport(
        num_requests=len(timings), num_completed=len(done), num_met_slo=met, duration_s=duration_s,
        throughput_rps=len(done) / dur, goodput_rps=met / dur,
        ttft=pct("ttft_s"), tpot=pct("tpot_s"), e2e=pct("e2e_s"), queue=pct("queue_s"),
        prefill=pct("prefill_s"), decode=pct("decode_s"),
        slo=slo, ttft_at_slo_percentile=_at(done, "ttft_s", slo), tpot_at_slo_percentile=_at(done, "tpot_s", slo),
    )


def _at(done: Sequence[RequestTimings], field: str, slo: SLO | None) -> float | None:
    """`field` at the SLO's percentile over completed requests (None without an SLO or values)."""
    if slo is None:
        return None
    return percentile([v for t in done if (v := getattr(t, field)) is not None], slo.percentile)
