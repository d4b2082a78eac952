"""The server under pressure: a client that disconnects mid-stream has its request aborted and its
blocks freed; overload gives 429 + Retry-After while accepted requests complete; the API key."""
from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from server_helpers import MODEL_NAME, serving, wait_until

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def slow_steps(stack):
    """Each step takes >= 5 ms (a listener runs inside step()), so 200 tokens take over a second."""
    engine = stack[1]
    nap = lambda _ev: time.sleep(0.005)
    engine.add_listener(nap)
    yield
    engine.remove_listener(nap)


@pytest.fixture
def finished(stack):
    """Timelines of the requests that end while the test runs."""
    engine, log = stack[1], []
    listener = lambda ev: log.extend(ev.finished)
    engine.add_listener(listener)
    yield log
    engine.remove_listener(listener)


@pytest.fixture(scope="module")
def stack(tiny_llama):
    # one seat and a queue of two: easy to overload; prefix caching off so freed blocks count as free
    with serving(tiny_llama, api_key=KEY, max_num_seqs=1, max_queue_len=2, enable_prefix_caching=False) as s:
        yield s


def test_api_key(stack):
    url = stack[0].url
    assert httpx.get(url + "/v1/models").status_code == 401
    r = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200  # open, as in vLLM
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert ok.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


def test_disconnect_mid_stream_aborts_and_frees_blocks(stack, slow_steps, finished):
    server, engine, aeng = stack
    body = {"prompt": "The quick brown fox", "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(8)) if line.startswith("data: ")]
        assert len(got) >= 3
        assert engine.block_manager.num_used_blocks > 0
        closed_at_step = engine.stats().num_steps
    # the response context closed the connection mid-stream
    assert wait_until(lambda: any(t.finish_reason == "abort" for t in finished), timeout=5)
    aborted = next(t for t in finished if t.finish_reason == "abort")
    assert aborted.num_output_tokens < 200
    assert wait_until(lambda: not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0)
    steps_after = engine.stats().num_steps - closed_at_step
    assert steps_after <= 4, steps_after  # aborted within a step or two of the disconnect
    assert aeng.num_open_streams() == 0


def test_disconnect_while_waiting_for_non_streamed_answer(stack, slow_steps, finished):
    server, engine, _ = stack
    body = {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=0.3)
    assert wait_until(lambda: any(t.finish_reason == "abort" for t in finished), timeout=5)
    assert next(t for t in finished if t.finish_reason == "abort").num_output_tokens < 200
    assert wait_until(lambda: engine.block_manager.num_used_blocks == 0)


async def _fire(url: str, n: int, max_tokens: int) -> list[httpx.Response]:
    body = {"prompt": "Continuous batching schedules every step", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0}
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
        return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(n)))


def test_overload_gives_429_while_accepted_requests_complete(stack, slow_steps):
    server, engine, _ = stack
    assert wait_until(lambda: not engine.has_unfinished())
    rejected_before = engine.stats().num_rejected
    t0 = time.perf_counter()
    responses = asyncio.run(_fire(server.url, 10, 24))
    codes = [r.status_code for r in responses]
    # at least the queue's two are accepted whatever the timing (a third when the engine thread drains one
    # into the seat before the rest arrive: prompts are tokenized in worker threads, so arrivals spread)
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 2, codes
    for r in responses:
        if r.status_code == 429:
            err = r.json()["error"]
            assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
            assert int(r.headers["Retry-After"]) >= 1
        else:
            assert r.json()["usage"]["completion_tokens"] == 24 and r.json()["choices"][0]["finish_reason"] == "length"
    assert engine.stats().num_rejected - rejected_before == codes.count(429)
    metrics = httpx.get(server.url + "/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("inferlab:request_rejected_total"))
    assert float(line.split()[-1]) == engine.stats().num_rejected  # Prometheus values are floats ("7.0")
    assert time.perf_counter() - t0 < 20
