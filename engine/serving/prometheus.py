"""Serving metrics in Prometheus text format (0.0.4), with vLLM-style names under `inferlab:`.

`ServingMetrics` is an engine step listener (`attach()`), or a subscriber of an EngineLoop
(`loop.subscribe(metrics)`: it then follows a rebuilt engine): it fills the latency histograms from the events the
engine publishes (perf_counter stamps from the engine thread) and, on `render()`, reads gauges and
cumulative counters from the engine itself. The exposition is written by prometheus_client (a custom
collector on a registry of its own, not the process-global one), so its escaping and number formats
are the ones every Prometheus scraper reads.

The listener runs in the engine thread and render() in the server's thread, hence the lock.
"""
from __future__ import annotations

import bisect
import math
import threading
from collections import Counter
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from engine.core.metrics import request_timings
from engine.events import EngineStepEvent, StepStats
from engine.serving.loop import Subscriber

# Bucket bounds (seconds) as vLLM uses them, so dashboards built for vLLM read these unchanged.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)

# name suffix -> (RequestTimings field, buckets, help)
_REQUEST_HISTOGRAMS = {
    "time_to_first_token_seconds": ("ttft_s", TTFT_BUCKETS, "Time from arrival to the first token."),
    "e2e_request_latency_seconds": ("e2e_s", REQUEST_BUCKETS, "Time from arrival to the last token."),
    "request_queue_time_seconds": ("queue_s", REQUEST_BUCKETS, "Time waiting before first scheduled."),
    "request_prefill_time_seconds": ("prefill_s", REQUEST_BUCKETS, "Time from first scheduled to first token."),
    "request_decode_time_seconds": ("decode_s", REQUEST_BUCKETS, "Time from first token to the last."),
    "request_time_per_output_token_seconds": ("tpot_s", ITL_BUCKETS, "Decode time per output token (TPOT)."),
}


class Histogram:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    __slots__ = ("bounds", "counts", "count", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)  # per bucket, not cumulative; +Inf is `count`
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # le semantics: value <= bound
        if i < len(self.counts):
            self.counts[i] += 1
        self.count += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, +Inf last, as prometheus_client's HistogramMetricFamily takes them."""
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append((floatToGoString(bound), running))
        out.append(("+Inf", self.count))
        return out

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append(f'{name}_bucket{{{labels},le="{_num(bound)}"}} {running}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {_num(self.total)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class ServingMetrics(Subscriber):
    def __init__(self, engine, model_name: str, prefix: str = "inferlab") -> None:
        self.engine = engine
        self.model_name = model_name
        self.prefix = prefix
        self._lock = threading.Lock()
        self._itl = Histogram(ITL_BUCKETS)
        self._request_hists = {name: Histogram(b) for name, (_f, b, _h) in _REQUEST_HISTOGRAMS.items()}
        self._finished: Counter[str] = Counter()
        self._last_token_time: dict[str, float] = {}
        # the gauges' numbers: the last step's StepStats (the engine thread hands them over), so the HTTP
        # thread never reads the scheduler or the block manager while a step changes them
        self._last_stats: StepStats | None = None
        self._num_blocks = engine.block_manager.num_blocks  # until a step says (the cache's size is fixed)
        self._registry = CollectorRegistry(auto_describe=False)  # this server's own, never the global one
        self._registry.register(self)

    def attach(self) -> ServingMetrics:
        self.engine.add_listener(self.on_step)
        return self

    def detach(self) -> None:
        self.engine.remove_listener(self.on_step)

    def on_engine(self, engine) -> None:
        """A rebuilt engine (EngineLoop): gauges and counters are read from it from now on (the counters
        restart from zero, which Prometheus reads as a counter reset); the histograms keep their history."""
        with self._lock:
            self.engine = engine
            self._last_token_time.clear()
            self._last_stats = None
            self._num_blocks = engine.block_manager.num_blocks

    def on_step(self, event: EngineStepEvent) -> None:
        """Engine thread: one inter-token latency per request per step that gave it tokens (as vLLM
        does, so a speculative step that emits several tokens counts once), stamped at the step's end."""
        now = event.stats.t_start + event.stats.wall_time_s
        with self._lock:
            self._last_stats = event.stats
            for out in event.outputs:
                if out.new_token_ids:
                    last = self._last_token_time.get(out.request_id)
                    if last is not None:
                        self._itl.observe(now - last)
                    self._last_token_time[out.request_id] = now
            for tl in event.finished:
                self._last_token_time.pop(tl.request_id, None)
                self._finished[tl.finish_reason or "unknown"] += 1
                t = request_timings(tl)
                for name, (field, _b, _h) in _REQUEST_HISTOGRAMS.items():
                    value = getattr(t, field)
                    if value is not None:
                        self._request_hists[name].observe(value)

    def render(self) -> str:
        """The exposition text (prometheus_client's), ending with a newline."""
        return generate_latest(self._registry).decode("utf-8")

    def collect(self):
        """prometheus_client's collector protocol: every family, read now (the server's thread)."""
        p, model = self.prefix, [self.model_name]
        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        for name, kind, help_, value in self._scalars():
            fam = kinds[kind](f"{p}:{name.removesuffix('_total')}", help_, labels=["model_name"])
            fam.add_metric(model, value)
            yield fam
        # the cache's configuration, as vLLM's cache_config_info publishes it
        info = GaugeMetricFamily(f"{p}:cache_config_info", "The KV cache's configuration (labels; value 1).",
                                 labels=["model_name", "block_size", "num_gpu_blocks"])
        info.add_metric([self.model_name, str(self.engine.config.block_size), str(self._num_blocks)], 1)
        yield info
        with self._lock:
            fam = CounterMetricFamily(f"{p}:request_success", "Finished requests by finish reason.",
                                      labels=["model_name", "finished_reason"])
            for reason, n in sorted(self._finished.items()):
                fam.add_metric([self.model_name, reason], n)
            yield fam
            hists = [("inter_token_latency_seconds", "Time between tokens of one request (per step).", self._itl)]
            hists += [(n, h, self._request_hists[n]) for n, (_f, _b, h) in _REQUEST_HISTOGRAMS.items()]
            for name, help_, hist in hists:
                fam = HistogramMetricFamily(f"{p}:{name}", help_, labels=["model_name"])
                fam.add_metric(model, hist.buckets(), hist.total)
                yield fam

    def _scalars(self) -> list[tuple[str, str, str, float]]:
        eng = self.engine
        st = eng.stats()
        with self._lock:
            last = self._last_stats
        running, waiting = (last.num_running, last.num_waiting) if last else (0, 0)
        spec = lambda name: getattr(st, name, 0) or 0  # speculative counters: 0 while speculation is off
        adm = getattr(eng, "admission", None)
        queue = adm.queue() if adm is not None else None
        wait = adm.predicted_wait_s(queue.num_waiting, queue.queued_tokens) if queue is not None else None
        return [
            ("num_requests_running", "gauge", "Requests in the running batch (last step).", running),
            ("num_requests_waiting", "gauge", "Requests waiting, queued or preempted (last step).", waiting),
            ("kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use, 0..1 (last step).",
             last.kv_usage if last else 0.0),
            ("predicted_queue_wait_seconds", "gauge",
             "PREDICTED wait of a new request (engine/core/admission.py model); NaN before a prefill is measured.",
             math.nan if wait is None else wait),
            ("queued_prompt_tokens", "gauge", "Tokens still to prefill for waiting requests (last step).",
             queue.queued_tokens if queue else 0),
            ("prompt_tokens_total", "counter", "Prefilled prompt tokens.", st.num_prompt_tokens),
            ("generation_tokens_total", "counter", "Generated tokens.", st.num_generated_tokens),
            ("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
             st.num_prompt_tokens),
            ("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
             st.num_prefix_cache_hit_tokens),
            ("num_preemptions_total", "counter", "Preemptions (recompute).", st.num_preemptions),
            ("request_rejected_total", "counter", "Requests refused by admission control.",
             getattr(st, "num_rejected", 0)),
            ("request_failed_total", "counter",
             "Requests that failed on their own (forward pass raised, non-finite logits); the others ran on.",
             getattr(st, "num_failed", 0)),
            ("spec_decode_num_draft_tokens_total", "counter", "Speculative draft tokens proposed.",
             spec("num_draft_tokens")),
            ("spec_decode_num_accepted_tokens_total", "counter", "Speculative draft tokens accepted.",
             spec("num_accepted_tokens")),
        ]


def _num(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v) if isinstance(v, float) else str(int(v))
