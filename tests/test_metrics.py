"""Latency budget (timings, percentiles, SLO, goodput) and the Prometheus exposition."""
from __future__ import annotations

import re

import numpy as np
import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.metrics import SLO, latency_report, percentile, percentiles, request_timings
from engine.events import RequestTimeline
from engine.serving.prometheus import Histogram, ServingMetrics


def tl(rid="r", arrival=0.0, sched=0.5, first=1.0, done=3.0, n_out=5, reason="length") -> RequestTimeline:
    return RequestTimeline(rid, arrival, 10, first_scheduled=sched, first_token=first, finished=done,
                           num_output_tokens=n_out, finish_reason=reason)


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    xs = list(rng.exponential(size=101))
    for p in (0, 50, 95, 99, 100):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    assert percentile([], 50) is None
    assert percentiles([1.0, None, 3.0]) == {"p50": 2.0, "p95": pytest.approx(2.9), "p99": pytest.approx(2.98)}


def test_request_timings_breakdown():
    t = request_timings(tl())
    assert (t.queue_s, t.prefill_s, t.decode_s, t.ttft_s, t.e2e_s) == (0.5, 0.5, 2.0, 1.0, 3.0)
    assert t.tpot_s == pytest.approx(0.5)  # 2 s over 4 tokens after the first
    assert t.queue_s + t.prefill_s == t.ttft_s and t.ttft_s + t.decode_s == t.e2e_s
    assert request_timings(tl(n_out=1)).tpot_s is None


def test_slo_and_goodput():
    slo = SLO(ttft_s=1.0, tpot_s=0.6, percentile=50)
    runs = [request_timings(x) for x in (
        tl("ok"),  # ttft 1.0, tpot 0.5
        tl("slow-first", first=2.0, done=4.0),  # ttft 2.0
        tl("slow-decode", done=6.0),  # tpot 1.25
        tl("aborted", reason="abort"),
        tl("one-token", n_out=1, done=1.0),  # tpot not judged
    )]
    assert [slo.met_by(t) for t in runs] == [True, False, False, False, True]
    rep = latency_report(runs, duration_s=10.0, slo=slo)
    assert rep.num_requests == 5 and rep.num_completed == 4 and rep.num_met_slo == 2
    assert rep.goodput_rps == pytest.approx(0.2) and rep.throughput_rps == pytest.approx(0.4)
    assert rep.slo_attainment == pytest.approx(0.4)
    assert rep.ttft["p50"] == pytest.approx(1.0) and rep.ttft_at_slo_percentile == pytest.approx(1.0)
    assert rep.meets_slo  # p50 TTFT 1.0 <= 1.0 and p50 TPOT (0.5, 0.5, 1.25) = 0.5 <= 0.6
    assert not latency_report(runs, 10.0, SLO(ttft_s=1.0, tpot_s=0.6, percentile=99)).meets_slo
    d = rep.as_dict()
    assert d["slo"] == {"ttft_s": 1.0, "tpot_s": 0.6, "percentile": 50} and d["goodput_rps"] == rep.goodput_rps
    with pytest.raises(ValueError):
        SLO(ttft_s=0, tpot_s=1)


def test_histogram_lines_are_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    assert h.lines("x", 'a="b"') == ['x_bucket{a="b",le="0.1"} 2', 'x_bucket{a="b",le="1.0"} 3',
                                     'x_bucket{a="b",le="+Inf"} 4', 'x_sum{a="b"} 2.65', 'x_count{a="b"} 4']


# prometheus_client writes a sample's labels sorted by name (Prometheus reads them in any order)
SAMPLE = re.compile(r'^inferlab:[a-z0-9_]+\{([a-z_]+="[^"]*",)*model_name="m"(,[a-z_]+="[^"]*")*\} '
                    r'(-?[0-9.e+-]+|NaN|\+Inf)$')


def test_serving_metrics_on_the_engine(tiny_llama):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))
    metrics = ServingMetrics(eng, "m").attach()
    eng.generate([[5, 6, 7, 8], [9, 10, 11]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    text = metrics.render()
    lines = text.splitlines()
    assert text.endswith("\n")
    for line in lines:
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or SAMPLE.match(line), line
    value = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in lines if not ln.startswith("#")}
    assert value['inferlab:time_to_first_token_seconds_count{model_name="m"}'] == 2
    assert value['inferlab:inter_token_latency_seconds_count{model_name="m"}'] == 2 * 5
    assert value['inferlab:generation_tokens_total{model_name="m"}'] == 12
    assert value['inferlab:prompt_tokens_total{model_name="m"}'] == 7
    assert value['inferlab:request_success_total{finished_reason="length",model_name="m"}'] == 2
    assert value['inferlab:num_requests_running{model_name="m"}'] == 0
    assert value['inferlab:spec_decode_num_draft_tokens_total{model_name="m"}'] == 0
    metrics.detach()


def test_gauges_come_from_the_last_step_not_the_live_scheduler(tiny_llama):
    """The HTTP thread renders the gauges from the last StepStats: it never reads the scheduler's queues or
    the block manager while the engine thread changes them (the counters come from engine.stats())."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4,
                                 max_num_seqs=1))
    metrics = ServingMetrics(eng, "m").attach()
    for start in (5, 20):
        eng.add_request(list(range(start, start + 6)), SamplingParams(max_tokens=4, temperature=0.0))
    eng.step()  # one runs, one waits (max_num_seqs=1)

    class Untouchable:
        def __init__(self, part, allowed=()):
            self._part, self._allowed = part, allowed

        def __getattr__(self, name):
            if name in self._allowed:
                return getattr(self._part, name)
            raise AssertionError(f"the metrics read the live {name}")

    live = eng.scheduler, eng.block_manager
    eng.scheduler = Untouchable(eng.scheduler, allowed=("num_preemptions",))  # a counter, in engine.stats()
    eng.block_manager = Untouchable(eng.block_manager, allowed=("num_prefix_hit_tokens",))
    try:
        lines = metrics.render().splitlines()
    finally:
        eng.scheduler, eng.block_manager = live
    value = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in lines if not ln.startswith("#")}
    assert value['inferlab:num_requests_running{model_name="m"}'] == 1
    assert value['inferlab:num_requests_waiting{model_name="m"}'] == 1
    assert 0 < value['inferlab:kv_cache_usage_perc{model_name="m"}'] < 1
    metrics.detach()
