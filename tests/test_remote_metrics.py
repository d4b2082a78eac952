"""An attached server's /metrics: recorded vLLM and SGLang payloads (tests/fixtures/metrics, versions named
there) parsed with prometheus_client's parser, the server recognised by its prefixes, counter rates over
two scrapes, percentiles estimated from buckets, and what a server does not export said as such."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.remote.facts import FactsTracker
from app.remote.metrics import Histogram, MetricsError, bucket_quantile, parse_metrics, server_kind

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def scrapes(kind: str):
    return [parse_metrics((FIXTURES / f"{kind}.scrape{i}.prom").read_text(), t) for i, t in ((1, 0.0), (2, 5.0))]


def facts_of(kind: str, name: str):
    tracker = FactsTracker(name)
    first, second = scrapes(kind)
    tracker.add(first)
    return tracker.add(second)


def test_bucket_quantile_interpolates_like_prometheus():
    h = Histogram((0.1, 0.2, float("inf")), (10.0, 30.0, 40.0))
    assert bucket_quantile(h, 0.25) == pytest.approx((0.1, False))  # rank 10: the top of the first bucket
    assert bucket_quantile(h, 0.5)[0] == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert bucket_quantile(h, 0.99) == (0.2, True)  # in +Inf: the largest finite bound, a lower bound
    assert bucket_quantile(Histogram((1.0, float("inf")), (0.0, 0.0)), 0.5) is None


def test_server_kind_from_prefixes_and_models():
    assert server_kind(scrapes("vllm-0.10")[0]) == "vllm"
    assert server_kind(scrapes("sglang-00ae9c1")[0]) == "sglang"
    assert server_kind(parse_metrics("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 5\n")) \
        == "llamacpp"
    assert server_kind(None, owned_by="llamacpp") == "llamacpp"
    assert server_kind(parse_metrics("")) is None


def test_vllm_payload():
    f = facts_of("vllm-0.10", "vllm")
    assert (f.running, f.waiting, f.kv_usage) == (12.0, 3.0, 0.42)
    assert f.prompt_tokens_per_s == pytest.approx(40000 / 5) and f.generation_tokens_per_s == pytest.approx(12000 / 5)
    assert f.prefix_hit_rate == pytest.approx(0.25)  # hits / queries over the window
    assert f.spec_acceptance == pytest.approx(0.7)
    assert f.preemptions_total == 4 and f.preemptions_per_s == pytest.approx(2 / 5)
    assert f.kv_blocks == (27264, 16)  # from cache_config_info's labels
    ttft = f.latency["ttft"]
    assert ttft.count == 100 and ttft.window_s == pytest.approx(5.0)  # the observations between the two scrapes
    # 50 at 0.03 s, 30 at 0.07 s, 20 at 0.3 s in vLLM's buckets: p50 is the top of (0.02, 0.04], p95 inside (0.25, 0.5]
    assert ttft.values[50] == pytest.approx(0.04) and ttft.values[95] == pytest.approx(0.4375)
    assert f.latency["itl"].count == 1000 and f.latency["e2e"].values[50] == pytest.approx(1.0 * 50 / 60 * 0.2 + 0.8)
    assert f.not_exposed == ()


def test_sglang_payload():
    f = facts_of("sglang-00ae9c1", "sglang")
    assert (f.running, f.waiting, f.kv_usage) == (12.0, 3.0, 0.42)
    assert f.prefix_hit_rate == pytest.approx(0.25)  # the server's own gauge
    assert f.spec_acceptance == pytest.approx(0.7)
    assert f.preemption_word == "retractions" and f.preemptions_per_s == pytest.approx(2 / 5)
    assert f.kv_blocks is None and f.kv_capacity_tokens == 160000
    assert f.latency["ttft"].values[50] == pytest.approx(0.04) and f.latency["itl"] is not None
    assert f.not_exposed == ()


def test_what_a_server_does_not_export_is_named():
    text = ("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 10\n"
            "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 4\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
            "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n")
    f = FactsTracker("llamacpp").add(parse_metrics(text, 1.0))
    assert (f.running, f.waiting) == (2.0, 1.0) and f.prompt_tokens_per_s is None  # one scrape: no rate yet
    assert {"TTFT histogram", "KV block counts", "preemptions", "prefix-cache hit rate"} <= set(f.not_exposed)
    assert "running requests" not in f.not_exposed


def test_counter_reset_counts_from_zero():
    t = FactsTracker("inferlab")
    line = "# TYPE inferlab:generation_tokens_total counter\ninferlab:generation_tokens_total {}\n"
    t.add(parse_metrics(line.format(1000), 0.0))
    f = t.add(parse_metrics(line.format(30), 2.0))  # the server restarted
    assert f.generation_tokens_per_s == pytest.approx(15.0)


@pytest.mark.parametrize("garbage", ["<html><body>502 Bad Gateway</body></html>", "{\"error\": \"nope\"}",
                                     "vllm:num_requests_running{model_name=\"m\" 1\n"])
def test_garbage_is_an_error(garbage):
    with pytest.raises(MetricsError):
        parse_metrics(garbage)


def test_llama_cpp_prefix_hits_count_against_processed_plus_cached():
    """llama-server counts the prompt tokens it processed and, apart, those it reused from its cache."""
    text = ("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total {}\n"
            "# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total {}\n")
    t = FactsTracker("llamacpp")
    t.add(parse_metrics(text.format(100, 0), 0.0))
    f = t.add(parse_metrics(text.format(150, 50), 1.0))
    assert f.prefix_hit_rate == pytest.approx(0.5) and f.prompt_tokens_per_s == pytest.approx(50.0)
    assert "prefix-cache hit rate" not in f.not_exposed


def test_an_integer_too_big_for_a_float_reads_as_infinite_not_a_crash():
    """The parser gives integer literals as ints; one of 500 digits does not fit a float (found by the fuzz
    test: OverflowError out of the scrape)."""
    import math

    big = "1" + "0" * 500
    text = (f"vllm:num_requests_running {big}\n"
            f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total {big}\n"
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            f'vllm:e2e_request_latency_seconds_bucket{{le="1.0"}} {big}\n'
            f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf"}} {big}\n'
            f"vllm:e2e_request_latency_seconds_sum -{big}\nvllm:e2e_request_latency_seconds_count {big}\n")
    scrape = parse_metrics(text, 0.0)
    assert scrape.gauges["vllm:num_requests_running"] == math.inf
    assert scrape.counters["vllm:prompt_tokens"] == math.inf
    hist = scrape.histograms["vllm:e2e_request_latency_seconds"]
    assert hist.cumulative == (math.inf, math.inf) and hist.total == -math.inf
