"""ServerFacts: what one scrape of a server's /metrics says, with counter rates and bucket percentiles.

`FactsTracker` keeps the last minute of scrapes. Counter rates are the change over the last
RATE_WINDOW_S seconds (a counter that went down restarted: its new value counts from 0). Latency
percentiles come from the histogram buckets observed over the last PERCENTILE_WINDOW_S seconds (all of
the server's history while that window has no observations), interpolated inside a bucket: they are
bucket estimates and say so. Computed in the scraper's thread; the GUI only shows them. A value that
is not finite (a gauge of +Inf, a counter of NaN) is no value: None, which the panel shows as "—".
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from app.remote.metrics import KIND_NAMES, METRIC_MAPS, MetricMap, Scrape, bucket_quantile, first, kv_blocks

RATE_WINDOW_S = 3.0
PERCENTILE_WINDOW_S = 30.0
HISTORY_S = 60.0
QUANTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class BucketPercentiles:
    """Percentiles estimated from a histogram's buckets (not from individual requests)."""

    values: dict[int, float]  # {50: s, 95: s, 99: s}
    capped: frozenset[int]  # those that fell in the +Inf bucket: a lower bound ("> x")
    count: int  # observations behind them
    window_s: float | None  # seconds they cover; None: everything since the server started


@dataclass(frozen=True, slots=True)
class ServerFacts:
    t: float  # perf_counter of the scrape
    kind: str  # vllm | sglang | llamacpp | inferlab
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction 0..1
    prefix_hit_rate: float | None = None  # fraction 0..1 (over the rate window, or the server's own gauge)
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    preemptions_total: float | None = None
    preemptions_per_s: float | None = None
    preemption_word: str = "preemptions"
    spec_acceptance: float | None = None  # accepted / drafted, fraction
    kv_blocks: tuple[int, int] | None = None  # (blocks, block size) where the server publishes its cache config
    kv_capacity_tokens: float | None = None
    latency: dict[str, BucketPercentiles | None] = field(default_factory=dict)  # ttft / itl / e2e
    not_exposed: tuple[str, ...] = ()  # facts this server's /metrics does not carry

    @property
    def server_name(self) -> str:
        return KIND_NAMES.get(self.kind, self.kind)


_FACT_NAMES = {"running": "running requests", "waiting": "waiting requests", "kv_usage": "KV cache usage",
               "prefix_hit_rate": "prefix-cache hit rate", "prompt_tokens_per_s": "prompt tokens/s",
               "generation_tokens_per_s": "generated tokens/s", "preemptions_total": "preemptions",
               "spec_acceptance": "speculative acceptance", "kv_blocks": "KV block counts",
               "ttft": "TTFT histogram", "itl": "inter-token histogram", "e2e": "end-to-end histogram"}


class FactsTracker:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.map: MetricMap = METRIC_MAPS.get(kind, MetricMap())
        self._history: deque[Scrape] = deque()

    def add(self, scrape: Scrape) -> ServerFacts:
        self._history.append(scrape)
        while self._history and scrape.t - self._history[0].t > HISTORY_S:
            self._history.popleft()
        m = self.map
        g, c = scrape.gauges, scrape.counters
        hit_rate = _finite(self._ratio(m.prefix_hits, m.prefix_queries, m.prefix_misses))
        if hit_rate is None:
            hit_rate = _finite(first(g, m.prefix_hit_rate))
        accept = self._ratio(m.spec_accepted, m.spec_drafts)
        if accept is None:
            accept = _finite(first(g, m.spec_accept_rate))
        preempt_total = _finite(first(c, m.preemptions))
        facts = dict(
            running=_finite(first(g, m.running)), waiting=_finite(first(g, m.waiting)),
            kv_usage=_finite(first(g, m.kv_usage)), prefix_hit_rate=hit_rate,
            prompt_tokens_per_s=_finite(self.rate(m.prompt_tokens)),
            generation_tokens_per_s=_finite(self.rate(m.generation_tokens)),
            preemptions_total=preempt_total, preemptions_per_s=_finite(self.rate(m.preemptions)),
            spec_acceptance=_finite(accept),
            kv_blocks=kv_blocks(scrape), kv_capacity_tokens=_finite(first(g, m.kv_capacity_tokens)))
        latency = {key: self.percentiles(getattr(m, key)) for key in ("ttft", "itl", "e2e")}
        missing = [name for key, name in _FACT_NAMES.items() if key not in latency and not self._exported(key, scrape)]
        missing += [_FACT_NAMES[key] for key in latency if first(scrape.histograms, getattr(m, key)) is None]
        if facts["kv_capacity_tokens"] is not None and _FACT_NAMES["kv_blocks"] in missing:
            missing.remove(_FACT_NAMES["kv_blocks"])  # the pool's size in tokens stands in for it
        return ServerFacts(t=scrape.t, kind=self.kind, preemption_word=m.preemption_word, latency=latency,
                           not_exposed=tuple(missing), **facts)

    def _exported(self, key: str, scrape: Scrape) -> bool:
        m, names = self.map, scrape.names()
        candidates = {"prefix_hit_rate": m.prefix_hits + m.prefix_hit_rate, "prompt_tokens_per_s": m.prompt_tokens,
                      "generation_tokens_per_s": m.generation_tokens, "preemptions_total": m.preemptions,
                      "spec_acceptance": m.spec_drafts + m.spec_accept_rate,
                      "kv_blocks": ("vllm:cache_config_info", "inferlab:cache_config_info")}
        names_for = candidates[key] if key in candidates else getattr(m, key)
        return any(n in names for n in names_for)

    def rate(self, names: tuple[str, ...]) -> float | None:
        """Per second over the last RATE_WINDOW_S (None until two scrapes carry the counter)."""
        now = self._history[-1]
        value = first(now.counters, names)
        if value is None:
            return None
        then = self._earlier(now.t - RATE_WINDOW_S)
        before = first(then.counters, names) if then is not None else None
        if before is None or now.t <= then.t:
            return None
        delta = value - before if value >= before else value  # a restarted server's counter starts again at 0
        return delta / (now.t - then.t)

    def _ratio(self, part: tuple[str, ...], whole: tuple[str, ...], rest: tuple[str, ...] = ()) -> float | None:
        """Growth of counter `part` over growth of counter `whole` (or of part + `rest`) in the rate window."""
        if not part:
            return None
        now = self._history[-1]
        then = self._earlier(now.t - RATE_WINDOW_S)

        def total(scrape: Scrape, names: tuple[str, ...]) -> float | None:
            if not rest:
                return first(scrape.counters, names)
            p, r = first(scrape.counters, part), first(scrape.counters, rest)
            return None if p is None or r is None else p + r

        p1, w1 = first(now.counters, part), total(now, whole)
        if p1 is None or w1 is None or then is None:
            return None
        p0, w0 = first(then.counters, part) or 0.0, total(then, whole) or 0.0
        dw = w1 - w0 if w1 >= w0 else w1
        if dw > 0:
            return (p1 - p0 if p1 >= p0 else p1) / dw
        return p1 / w1 if w1 > 0 else None

    def percentiles(self, names: tuple[str, ...]) -> BucketPercentiles | None:
        now = self._history[-1]
        hist = first(now.histograms, names)
        if hist is None or not hist.is_finite or hist.count <= 0:
            return None
        then = self._earlier(now.t - PERCENTILE_WINDOW_S)
        window = hist.minus(first(then.histograms, names) if then is not None else None)
        span = now.t - then.t if then is not None and window is not hist else None
        if not window.is_finite or window.count <= 0:  # nothing finished lately: the server's whole history
            window, span = hist, None
        values, capped = {}, set()
        for q in QUANTILES:
            est = bucket_quantile(window, q / 100)
            if est is not None and math.isfinite(est[0]):
                values[q] = est[0]
                if est[1]:
                    capped.add(q)
        return BucketPercentiles(values, frozenset(capped), int(window.count), span)

    def _earlier(self, t: float) -> Scrape | None:
        """The oldest scrape at or after `t` other than the newest (the start of a window)."""
        for s in self._history:
            if s.t >= t and s is not self._history[-1]:
                return s
        return self._history[-2] if len(self._history) >= 2 else None


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)
