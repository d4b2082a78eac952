"""The attached app against a server that misbehaves (issue 26, class 2): bodies and lines that never end
or arrive a byte at a time, values that are not finite or not numbers, fields of the wrong type. Each
read stops at a limit in bounded memory and time, each case is a visible status (or a request finished
with an error that says why), and the scraper goes on after any failure. Local servers on 127.0.0.1 only
(tests/hostile_server.py)."""
from __future__ import annotations

import asyncio
import time
import tracemalloc

import httpx
import pytest
from hostile_server import HostileServer, body, endless, sse, trickle

from app.remote import bounded
from app.remote.client import StreamResult, request_body, stream_request
from app.remote.watch import ServerWatch
from app.source import channel

MODELS = body('{"data": [{"id": "m", "max_model_len": 4096}]}', "application/json")
GOOD_METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
CASE_S = 10.0  # every case must end well within this, whatever the server does
MAX_PEAK_BYTES = 48 * 2**20  # Python allocations during one case (the app grew to 1.4 GB before)


def run_bounded(coro_fn):
    """Run coro_fn() with tracemalloc on: (its result, peak bytes, seconds); it must end within CASE_S."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        result = asyncio.run(asyncio.wait_for(coro_fn(), CASE_S))
        return result, tracemalloc.get_traced_memory()[1], time.monotonic() - t0
    finally:
        tracemalloc.stop()


def scrape(routes: dict, looks: int = 1, timeout_s: float = 1.0):
    """A ServerWatch's `looks` looks at a hostile server: (the watch, what it published, peak bytes)."""
    published, answers = [], []
    with HostileServer({"/v1/models": MODELS, **routes}) as server:
        watch = ServerWatch(server.url, timeout_s, published.append, answers.append)

        async def look():
            async with httpx.AsyncClient() as client:
                watch._client = client
                return [await watch.scrape_once() for _ in range(looks)]

        _ok, peak, _s = run_bounded(look)
    return watch, published, peak


@pytest.mark.parametrize("metrics,why", [
    (endless(), "more than"),
    (endless(b"vllm:num_requests_running 1\n" * 1000), "more than"),
    (trickle(GOOD_METRICS.encode()), "did not answer /metrics within 1 s"),
])
def test_a_metrics_body_that_never_ends_or_trickles_is_a_status_in_bounded_memory(metrics, why):
    watch, published, peak = scrape({"/metrics": metrics})
    assert watch.status[0] in ("down", "garbage") and why in watch.status[1], watch.status
    assert any(isinstance(p, channel.ServerStatus) for p in published)
    assert peak < MAX_PEAK_BYTES


def test_a_models_answer_that_never_ends_is_a_status_not_connecting_for_ever():
    watch, _published, peak = scrape({"/v1/models": trickle(b'{"data": [{"id": "m"}]}')})
    assert watch.status[0] == "down" and "did not finish" in watch.status[1], watch.status
    assert peak < MAX_PEAK_BYTES


def test_values_that_are_not_finite_are_no_values():
    payload = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running +Inf\n"
               "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting NaN\n"
               "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total +Inf\n"
               "# TYPE vllm:cache_config_info gauge\n"
               'vllm:cache_config_info{block_size="16",num_gpu_blocks="inf"} 1.0\n'
               "# TYPE vllm:time_to_first_token_seconds histogram\n"
               'vllm:time_to_first_token_seconds_bucket{le="0.1"} +Inf\n'
               'vllm:time_to_first_token_seconds_bucket{le="+Inf"} +Inf\n'
               "vllm:time_to_first_token_seconds_count +Inf\nvllm:time_to_first_token_seconds_sum 1.0\n")
    watch, _published, _peak = scrape({"/metrics": body(payload)}, looks=2)
    assert watch.status[0] == "connected", watch.status
    f = watch.facts
    assert (f.running, f.waiting, f.preemptions_total, f.kv_blocks) == (None, None, None, None)
    assert f.latency["ttft"] is None


def test_a_context_length_that_is_not_one_is_ignored_with_a_message_and_the_app_attaches():
    models = body('{"data": [{"id": "m", "max_model_len": 1' + "0" * 400 + "}]}", "application/json")
    watch, published, _peak = scrape({"/v1/models": models, "/metrics": body(GOOD_METRICS)})
    assert watch.answered and watch.max_model_len is None and watch.status[0] == "connected"
    assert any(isinstance(p, channel.Message) and "max_model_len" in p.text for p in published)


def test_the_scraper_goes_on_after_any_failure():
    published, calls = [], []

    def first_answer_fails_once(has_metrics):
        calls.append(has_metrics)
        if len(calls) == 1:
            raise OverflowError("the window could not take it")

    with HostileServer({"/v1/models": MODELS, "/metrics": body(GOOD_METRICS)}) as server:
        watch = ServerWatch(server.url, 1.0, published.append, first_answer_fails_once)

        async def run_a_while():
            async with httpx.AsyncClient() as client:
                task = asyncio.create_task(watch.run(client, 0.05))
                await asyncio.sleep(2.5)  # the failed look, RETRY_S, then a good one
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        run_bounded(run_a_while)
    states = [p.state for p in published if isinstance(p, channel.ServerStatus)]
    assert "garbage" in states and states[-1] == "connected", states
    assert watch.answered and len(calls) == 2


def stream(route: bool | object):
    """One streaming request to a server whose /v1/completions behaves as `route`: (result, peak bytes)."""
    with HostileServer({"/v1/completions": route}) as server:
        path, req = request_body("m", "Hi", max_tokens=4, temperature=0.0, chat=False)

        async def go():
            async with httpx.AsyncClient(timeout=5.0) as client:
                return await stream_request(client, server.url, path, req, StreamResult("r"))

        res, peak, _s = run_bounded(go)
    return res, peak


@pytest.mark.parametrize("route,why", [
    (endless(b"a" * 65536, prefix=b"data: "), "longer than"),
    (endless(b'data: {"pad": "' + b"a" * 4000 + b'"}\n\n', content_type="text/event-stream"), "more than"),
    (sse({"choices": [{"delta": "x"}]}), "delta is not an object"),
    (sse({"choices": [{"delta": {"content": 5}}]}), "text is not a string"),
    (sse({"choices": [{"text": "a", "finish_reason": 3}]}), "finish_reason"),
    (sse({"choices": "abc"}), "choices"),
    (sse({"choices": [], "usage": {"completion_tokens": "many"}}), "usage.completion_tokens"),
    (sse({"choices": [], "usage": {"prompt_tokens": 10 ** 400}}), "usage.prompt_tokens"),
    (sse({"choices": [], "usage": {"completion_tokens": 1.5}}), "usage.completion_tokens"),
    (sse({"choices": [], "usage": [1, 2]}), "usage is not an object"),
    (sse("{not json"), "not JSON"),
    (endless(prefix=b"oops", content_type="text/html"), "HTTP"),
])
def test_a_hostile_stream_finishes_with_an_error_that_says_why(route, why, monkeypatch):
    if why == "more than":
        monkeypatch.setattr(bounded, "MAX_STREAM_BYTES", 2 * 2**20)
    if why == "longer than":  # (below the stream's own cap for its 4 tokens, 320 KiB)
        monkeypatch.setattr(bounded, "MAX_LINE_BYTES", 128 * 1024)
    if why == "HTTP":
        route = _status(500, route)
    res, peak = stream(route)
    assert res.finish_reason == "error" and why in (res.error or ""), (res.finish_reason, res.error)
    assert res.finished is not None
    assert peak < MAX_PEAK_BYTES


def test_a_stream_line_sent_a_byte_at_a_time_is_cut_off(monkeypatch):
    monkeypatch.setattr(bounded, "LINE_TIMEOUT_S", 1.0)
    res, _peak = stream(trickle(b'data: {"choices": [{"text": "slow"}]}\n\n', content_type="text/event-stream"))
    assert res.finish_reason == "error" and "a line of the stream took longer" in res.error, res.error


def test_a_well_formed_stream_still_reads():
    res, _peak = stream(sse({"choices": [{"text": "Hel"}]}, {"choices": [{"delta": {"content": "lo"}}]},
                            {"choices": [{"text": "", "finish_reason": "length"}]},
                            {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}}))
    assert (res.text, res.finish_reason, res.completion_tokens, res.error) == ("Hello", "length", 2, None)


def _status(status: int, behaviour):
    """`behaviour`'s body under another status line."""
    async def send(w):
        real_write = w.write

        def write(data: bytes) -> None:
            real_write(data.replace(b"HTTP/1.1 200 X", f"HTTP/1.1 {status} X".encode(), 1))
        w.write = write
        await behaviour(w)
    return send
