"""A server's Prometheus /metrics as plain data: parsed with prometheus_client's parser, never by hand.

`parse_metrics(text)` turns one payload into a `Scrape` (gauges, counters and histograms by family
name, summed over their label sets: a vLLM with several engines or an SGLang with several ranks reads
as one server). `server_kind(scrape)` recognises the server by its metric prefixes. The per-kind tables
(`METRIC_MAPS`) say which family carries which fact; a fact whose family a server does not export stays
None and is listed as not exposed. Pure Python, no Qt: the attached source scrapes in a worker thread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KIND_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "inferlab": "inferlab"}
MAX_PAYLOAD_CHARS = 8 * 2**20  # a /metrics page larger than this is not a metrics page
MAX_COUNT = 2**40  # a block count or size beyond this is not one


class MetricsError(ValueError):
    """The payload is not Prometheus text (an HTML page, a truncated body, a proxy's error)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative buckets as Prometheus exposes them: upper bounds (the last +Inf) and counts."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float = 0.0  # the _sum

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    @property
    def is_finite(self) -> bool:
        """Counts and sum are finite numbers (a hostile or broken server's +Inf count is no histogram)."""
        return all(math.isfinite(c) for c in self.cumulative) and math.isfinite(self.total)

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier` (itself when the buckets changed or the counter reset)."""
        if earlier is None or earlier.bounds != self.bounds or earlier.count > self.count:
            return self
        return Histogram(self.bounds, tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative)),
                         self.total - earlier.total)


@dataclass(frozen=True, slots=True)
class Scrape:
    t: float  # when it was read (perf_counter)
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    info: dict[str, dict[str, str]] = field(default_factory=dict)  # labels of gauges that carry config (…_info)
    num_families: int = 0

    def names(self) -> set[str]:
        return set(self.gauges) | set(self.counters) | set(self.histograms) | set(self.info)


def parse_metrics(text: str, t: float = 0.0) -> Scrape:
    """One /metrics payload as a Scrape; MetricsError when it is not Prometheus text."""
    if len(text) > MAX_PAYLOAD_CHARS:
        raise MetricsError(f"the /metrics payload is {len(text)} characters, more than any server writes")
    gauges: dict[str, list[float]] = {}
    counters: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    info: dict[str, dict[str, str]] = {}
    n = 0
    try:
        for fam in text_string_to_metric_families(text):
            n += 1
            if fam.type == "counter":
                counters[fam.name] = sum(_as_float(s.value) for s in fam.samples if s.name.endswith("_total")
                                         or s.name == fam.name)
            elif fam.type == "histogram":
                hists[fam.name] = _histogram(fam)
            elif fam.type in ("gauge", "unknown", "untyped"):
                values = [_as_float(s.value) for s in fam.samples if s.name == fam.name]
                if fam.name.endswith("_info") and fam.samples:
                    info[fam.name] = dict(fam.samples[0].labels)
                if values:
                    gauges[fam.name] = values
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
        raise MetricsError(f"/metrics is not Prometheus text: {exc}") from None
    if n == 0 and text.strip():
        raise MetricsError("/metrics is not Prometheus text: no metric families in it")
    return Scrape(t, {k: _gauge_value(v) for k, v in gauges.items()}, counters, hists, info, n)


def _as_float(value) -> float:
    """A sample's value as a float: the parser gives an integer literal as an int, and one of 500 digits
    (a hostile or broken server) does not fit a float: it is infinite here, not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _gauge_value(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) if finite else math.nan


def _histogram(fam) -> Histogram:
    """Buckets summed over the label sets (one histogram per engine or rank), sorted by bound."""
    by_bound: dict[float, float] = {}
    total = 0.0
    for s in fam.samples:
        if s.name.endswith("_bucket") and "le" in s.labels:
            bound = float(s.labels["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + _as_float(s.value)
        elif s.name.endswith("_sum"):
            total += _as_float(s.value)
    bounds = tuple(sorted(by_bound))
    return Histogram(bounds, tuple(by_bound[b] for b in bounds), total)


def server_kind(scrape: Scrape | None, owned_by: str = "") -> str | None:
    """'vllm' | 'sglang' | 'llamacpp' | 'inferlab' from the metric prefixes (the most families wins), else
    from /v1/models' owned_by; None when neither says."""
    if scrape is not None:
        counts = {kind: sum(1 for name in scrape.names() if name.startswith(kind + ":")) for kind in KIND_NAMES}
        best = max(counts, key=counts.get)
        if counts[best]:
            return best
    owner = owned_by.lower().replace(".", "").replace("-", "").replace("_", "")
    return next((k for k in KIND_NAMES if k in owner), None)


@dataclass(frozen=True, slots=True)
class MetricMap:
    """Which families carry which fact on one kind of server: the first name present wins."""

    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()  # gauge, fraction 0..1 of the KV cache in use
    prefix_hits: tuple[str, ...] = ()  # counters of tokens: hits / queries
    prefix_queries: tuple[str, ...] = ()
    prefix_misses: tuple[str, ...] = ()  # or a counter of the prompt tokens not found (queries = hits + misses)
    prefix_hit_rate: tuple[str, ...] = ()  # or a gauge the server computes itself
    prompt_tokens: tuple[str, ...] = ()  # counters
    generation_tokens: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    ttft: tuple[str, ...] = ()  # histograms, seconds
    itl: tuple[str, ...] = ()
    e2e: tuple[str, ...] = ()
    spec_drafts: tuple[str, ...] = ()  # counters of draft tokens proposed / accepted
    spec_accepted: tuple[str, ...] = ()
    spec_accept_rate: tuple[str, ...] = ()  # or a gauge
    kv_capacity_tokens: tuple[str, ...] = ()  # gauge: the KV pool's size in tokens
    preemption_word: str = "preemptions"


METRIC_MAPS: dict[str, MetricMap] = {
    # vllm/v1/metrics/loggers.py (0.10 series); older names as fallbacks
    "vllm": MetricMap(
        running=("vllm:num_requests_running",), waiting=("vllm:num_requests_waiting",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        prefix_hits=("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        prefix_queries=("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        prefix_hit_rate=("vllm:gpu_prefix_cache_hit_rate",),
        prompt_tokens=("vllm:prompt_tokens",), generation_tokens=("vllm:generation_tokens",),
        preemptions=("vllm:num_preemptions",),
        ttft=("vllm:time_to_first_token_seconds",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        e2e=("vllm:e2e_request_latency_seconds",),
        spec_drafts=("vllm:spec_decode_num_draft_tokens",), spec_accepted=("vllm:spec_decode_num_accepted_tokens",)),
    # python/sglang/srt/metrics/collector.py
    "sglang": MetricMap(
        running=("sglang:num_running_reqs",), waiting=("sglang:num_queue_reqs",), kv_usage=("sglang:token_usage",),
        prefix_hit_rate=("sglang:cache_hit_rate",),
        prompt_tokens=("sglang:prompt_tokens",), generation_tokens=("sglang:generation_tokens",),
        preemptions=("sglang:num_retracted_requests",),
        ttft=("sglang:time_to_first_token_seconds",),
        itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        e2e=("sglang:e2e_request_latency_seconds",), spec_accept_rate=("sglang:spec_accept_rate",),
        kv_capacity_tokens=("sglang:max_total_num_tokens",), preemption_word="retractions"),
    # tools/server/server-task.cpp (llama-server --metrics; the tree in llama-cpp-python 0.3.36): prompt_tokens
    # counts the tokens it processed, prompt_tokens_cached those it reused; kv_cache_usage_ratio is older builds'
    "llamacpp": MetricMap(
        running=("llamacpp:requests_processing",), waiting=("llamacpp:requests_deferred",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        prefix_hits=("llamacpp:prompt_tokens_cached",), prefix_misses=("llamacpp:prompt_tokens",),
        prompt_tokens=("llamacpp:prompt_tokens",), generation_tokens=("llamacpp:tokens_predicted",),
        spec_drafts=("llamacpp:spec_decode_num_draft_tokens",),
        spec_accepted=("llamacpp:spec_decode_num_accepted_tokens",)),
    # engine/serving/prometheus.py
    "inferlab": MetricMap(
        running=("inferlab:num_requests_running",), waiting=("inferlab:num_requests_waiting",),
        kv_usage=("inferlab:kv_cache_usage_perc",),
        prefix_hits=("inferlab:prefix_cache_hits",), prefix_queries=("inferlab:prefix_cache_queries",),
        prompt_tokens=("inferlab:prompt_tokens",), generation_tokens=("inferlab:generation_tokens",),
        preemptions=("inferlab:num_preemptions",),
        ttft=("inferlab:time_to_first_token_seconds",), itl=("inferlab:inter_token_latency_seconds",),
        e2e=("inferlab:e2e_request_latency_seconds",),
        spec_drafts=("inferlab:spec_decode_num_draft_tokens",),
        spec_accepted=("inferlab:spec_decode_num_accepted_tokens",)),
}


def first(table: dict, names: tuple[str, ...]):
    """The value of the first of `names` in `table` (None when none is there)."""
    return next((table[n] for n in names if n in table), None)


def kv_blocks(scrape: Scrape) -> tuple[int, int] | None:
    """(number of KV blocks, block size) where the server publishes its cache configuration (vLLM's and
    inferlab's cache_config_info labels); None elsewhere."""
    labels = scrape.info.get("vllm:cache_config_info") or scrape.info.get("inferlab:cache_config_info")
    try:
        blocks, size = (float(labels["num_gpu_blocks"]), float(labels["block_size"])) if labels else (0, 0)
    except (KeyError, ValueError, TypeError):
        return None
    if not (0 < blocks <= MAX_COUNT and 0 < size <= MAX_COUNT):  # "inf", "nan", 1e400: not a count
        return None
    return int(blocks), int(size)


def bucket_quantile(hist: Histogram, q: float) -> tuple[float, bool] | None:
    """The q-quantile (0..1) estimated from cumulative buckets as Prometheus' histogram_quantile does:
    linear inside the bucket that holds the rank. Returns (value, capped): capped when the rank falls in
    the +Inf bucket (the value is then the largest finite bound, a lower bound). None without data."""
    count = hist.count
    if count <= 0 or not hist.bounds:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for bound, cum in zip(hist.bounds, hist.cumulative):
        if cum >= rank and cum > below:
            if math.isinf(bound):
                return lower, True
            return lower + (bound - lower) * (rank - below) / (cum - below), False
        if not math.isinf(bound):
            lower = bound
        below = cum
    return lower, True
