"""Fuzz of the attached app's reads (issue 26, class 2): generated hostile /metrics pages and SSE streams
(values that are not numbers or not finite, fields of any type, garbage lines, bodies too large, sent a
byte at a time or never ending), served from 127.0.0.1. Every case ends within a bound, in bounded memory,
with a status (scraper) or a finished request with a reason (stream); shown figures are finite or none."""
from __future__ import annotations

import asyncio
import json
import math
import tracemalloc

import httpx
import pytest
from hostile_server import HostileServer, body, endless, trickle
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.remote import bounded, watch
from app.remote.client import StreamResult, request_body, stream_request
from app.remote.watch import ServerWatch
from app.source import channel

CASE_S = 8.0
MAX_PEAK_BYTES = 24 * 2**20
STATES = {"connecting", "connected", "slow", "down", "garbage", "no-metrics"}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def server():
    with HostileServer({}) as s:
        yield s


@pytest.fixture
def small_limits(monkeypatch):
    """Limits a test can reach in milliseconds (the behaviour at a limit is what is checked)."""
    monkeypatch.setattr(watch, "MAX_PAYLOAD_CHARS", 64 * 1024)
    monkeypatch.setattr(bounded, "MAX_LINE_BYTES", 16 * 1024)
    monkeypatch.setattr(bounded, "MAX_STREAM_BYTES", 256 * 1024)
    monkeypatch.setattr(bounded, "LINE_TIMEOUT_S", 0.5)


def bounded_run(coro_fn):
    tracemalloc.start()
    try:
        result = asyncio.run(asyncio.wait_for(coro_fn(), CASE_S))
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["+Inf", "-Inf", "NaN", "1e400", "inf", "abc", "", "1" + "0" * 500]),
                    st.integers(-(2**70), 2**70).map(str))
names = st.sampled_from(["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total", "sglang:token_usage",
                         "inferlab:num_requests_running", "x", "vllm:cache_config_info"])
labels = st.one_of(st.just(""), st.builds(lambda a, b: f'{{num_gpu_blocks="{a}",block_size="{b}"}}', numbers, numbers),
                   st.sampled_from(['{le="0.1"}', '{le="+Inf"}', "{", '{a="b"']))
metric_line = st.one_of(st.builds(lambda n, lab, v: f"{n}{lab} {v}", names, labels, numbers),
                        st.builds(lambda n, t: f"# TYPE {n} {t}", names,
                                  st.sampled_from(["gauge", "counter", "histogram", "bogus"])),
                        st.text(max_size=40))
delivery = st.sampled_from(["whole", "whole", "whole", "trickle", "endless", "huge"])


def served(text: str, how: str, content_type: str = "text/plain"):
    data = text.encode("utf-8", "surrogatepass")
    if how == "trickle":
        return trickle(data[:100] or b"x", every_s=0.02, content_type=content_type)  # 2 s: past 0.5 s timeouts
    if how == "endless":
        return endless(data[:4096] or b"x", content_type=content_type)
    if how == "huge":
        return body(data * (200_000 // max(1, len(data)) + 1), content_type)
    return body(data, content_type)


@FUZZ
@given(lines=st.lists(metric_line, max_size=30), how=delivery,
       models=st.sampled_from(['{"data": [{"id": "m", "max_model_len": 1' + "0" * 400 + "}]}",
                               '{"data": [{"id": "m", "max_model_len": "inf"}]}', '{"data": 5}', "[]",
                               '{"data": [{"id": "m", "context_length": -3}]}', "<html>", "{" * 5000]))
def test_any_metrics_page_ends_in_a_status_in_bounded_memory(server, small_limits, lines, how, models):
    server.routes["/v1/models"] = body(models, "application/json")
    server.routes["/metrics"] = served("\n".join(lines) + "\n", how)
    published = []
    w = ServerWatch(server.url, 0.5, published.append, lambda _has: None)

    async def two_looks():
        async with httpx.AsyncClient() as client:
            w._client = client
            return [await w.scrape_once() for _ in range(2)]

    _ok, peak = bounded_run(two_looks)
    statuses = [p for p in published if isinstance(p, channel.ServerStatus)]
    assert statuses and all(s.state in STATES and s.text for s in statuses)
    assert peak < MAX_PEAK_BYTES
    if w.max_model_len is not None:
        assert 0 < w.max_model_len <= watch.MAX_CONTEXT
    facts = w.facts
    if facts is not None:
        for name in ("running", "waiting", "kv_usage", "prefix_hit_rate", "preemptions_total", "spec_acceptance",
                     "kv_capacity_tokens", "prompt_tokens_per_s", "generation_tokens_per_s"):
            value = getattr(facts, name)
            assert value is None or math.isfinite(value), (name, value)


anything = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
                     st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
chunk = st.one_of(
    st.builds(lambda t, r: {"choices": [{"text": t, "finish_reason": r}]}, anything, anything),
    st.builds(lambda d: {"choices": [{"delta": d}]}, anything),
    st.builds(lambda c: {"choices": c}, anything),
    st.builds(lambda u: {"choices": [], "usage": u}, st.one_of(anything, st.fixed_dictionaries(
        {"completion_tokens": anything, "prompt_tokens": anything}))),
    st.builds(lambda e: {"error": e}, anything),
    st.text(max_size=30),
    st.just("x" * 40_000))  # a line longer than the limit


@FUZZ
@given(chunks=st.lists(chunk, max_size=12), how=delivery, done=st.booleans())
@example(chunks=[{"error": ""}], how="whole", done=False)  # an empty error: still an error, with words
def test_any_stream_finishes_with_a_reason_in_bounded_memory(server, small_limits, chunks, how, done):
    events = "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks)
    server.routes["/v1/completions"] = served(events + ("data: [DONE]\n\n" if done else ""), how,
                                              "text/event-stream")
    path, req = request_body("m", "Hi", max_tokens=4, temperature=0.0, chat=False)

    async def go():
        async with httpx.AsyncClient(timeout=2.0) as client:
            return await stream_request(client, server.url, path, req, StreamResult("r"))

    res, peak = bounded_run(go)
    assert res.finish_reason is not None and res.finished is not None
    assert res.error is None or (res.finish_reason == "error" and res.error)
    assert res.completion_tokens is None or (type(res.completion_tokens) is int and res.completion_tokens >= 0)
    assert isinstance(res.text, str) and res.num_tokens >= 0
    assert peak < MAX_PEAK_BYTES
