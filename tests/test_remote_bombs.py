"""An attached server that floods or packs (issue 48, points 1 and 2): a stream of tiny events without end is
cut at what its request asked for (text chunks for max_tokens, characters, bytes on the wire), streams
together at a shared budget, and no event carries a copy of the whole text; a compression bomb (gzip of
gzip, or one gzip layer of a GiB of zeros) is unpacked a bounded piece at a time or refused by name, and
every request asks for the body as it is. Local servers on 127.0.0.1 only (tests/hostile_server.py)."""
from __future__ import annotations

import asyncio
import gzip
import time

import httpx
import pytest
from hostile_server import HostileServer, body, endless, gzip_of_zeros, packed, sse
from test_remote_hostile import GOOD_METRICS, MAX_PEAK_BYTES, MODELS, run_bounded, scrape, stream

from app.remote import bounded
from app.remote.client import StreamResult, request_body, stream_request
from app.source import channel

TINY = b'data: {"choices": [{"text": "a"}]}\n\n'
FLOOD = endless(TINY * 64, content_type="text/event-stream")
BOMB_BYTES = 128 * 2**20  # unpacked; packs to ~130 KB (the probe's was 1 GiB from 1.8 KB)


def test_an_sse_flood_ends_at_the_text_chunks_its_request_asked_for():
    res, peak = stream(FLOOD)  # max_tokens 4
    assert res.finish_reason == "error" and "more than 12 text chunks for max_tokens 4" in res.error, res.error
    assert len(res.chunk_times) == 12 and res.text == "a" * 12 and peak < MAX_PEAK_BYTES


def test_a_flood_of_events_without_text_ends_at_the_bytes_its_request_asked_for():
    res, _peak = stream(endless(b'data: {"choices": []}\n\n' * 64, content_type="text/event-stream"))
    assert res.finish_reason == "error" and "the stream sent more than 320 KiB" in res.error, res.error


def test_a_chunk_with_more_text_than_its_tokens_could_hold_ends_the_stream():
    res, _peak = stream(sse({"choices": [{"text": "x" * 1100}]}))  # 4 tokens: at most 1,024 characters
    assert res.finish_reason == "error" and "more than 1,024 characters for max_tokens 4" in res.error, res.error


def test_streams_together_stop_at_their_shared_budget_and_give_it_back():
    from app.remote.client import StreamBudget

    held = []

    class Watched(StreamBudget):
        def take(self, chars):
            ok = super().take(chars)
            held.append(self.chunks)
            return ok

    budget = Watched(max_chunks=300, max_chars=10**6)
    with HostileServer({"/v1/completions": FLOOD}) as server:
        path, req = request_body("m", "Hi", max_tokens=1000, temperature=0.0, chat=False)

        async def three_streams():
            async with httpx.AsyncClient(timeout=5.0) as client:
                return await asyncio.gather(*(stream_request(client, server.url, path, req, StreamResult(f"r{i}"),
                                                             budget=budget) for i in range(3)))

        results, peak, _s = run_bounded(three_streams)
    assert max(held) == 300 and peak < MAX_PEAK_BYTES  # held together at once, never more
    assert any("the streams in flight together went over 300 text chunks" in (r.error or "") for r in results)
    assert (budget.chunks, budget.chars) == (0, 0)  # every stream gave its share back when it ended


def test_an_attached_flood_publishes_each_text_once_and_ends_every_stream(qapp):
    from app.remote.source import RemoteSource
    from engine.sampling_params import SamplingParams

    routes = {"/v1/models": MODELS, "/metrics": body(GOOD_METRICS), "/v1/completions": FLOOD}
    with HostileServer(routes) as server:
        source = RemoteSource(server.url, scrape_hz=20.0)
        source.start()
        try:
            deadline = time.monotonic() + 10
            while source.info is None and time.monotonic() < deadline:
                time.sleep(0.02)
            for _ in range(8):
                source.add_request("hi", SamplingParams(max_tokens=16))
            while (source.in_flight or len(source._events) < 8) and time.monotonic() < deadline:
                time.sleep(0.02)
            items = source.drain()
        finally:
            source.shutdown()
    outputs = [i.output for i in items if isinstance(i, channel.ClientOutput)]
    finished = [i for i in items if isinstance(i, channel.ClientFinished)]
    assert len(finished) == 8 and all("more than 24 text chunks" in f.error for f in finished)
    streamed = sum(len(o.new_text) for o in outputs)
    assert streamed == 8 * 24 and sum(len(o.text) for o in outputs) == streamed  # the whole text once, at the end


def test_a_metrics_bomb_of_gzip_in_gzip_is_refused_by_name_in_bounded_memory():
    bomb = gzip.compress(gzip_of_zeros(BOMB_BYTES), 9)
    watch, _published, peak = scrape({"/metrics": packed(bomb, "gzip, gzip")}, timeout_s=5.0)
    assert watch.status[0] == "garbage" and "packed as 'gzip, gzip'" in watch.status[1], watch.status
    assert peak < MAX_PEAK_BYTES


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_metrics_bomb_of_one_layer_stops_at_the_size_cap_in_bounded_memory(coding):
    bomb = gzip_of_zeros(BOMB_BYTES, 31 if coding == "gzip" else 15)  # (HTTP's deflate: zlib's wrapping)
    watch, _published, peak = scrape({"/metrics": packed(bomb, coding)}, timeout_s=5.0)
    assert watch.status[0] == "garbage" and "sent more than 8,192 KiB" in watch.status[1], watch.status
    assert peak < MAX_PEAK_BYTES


def test_packed_metrics_that_are_metrics_still_read():
    watch, _published, _peak = scrape({"/metrics": packed(gzip.compress(GOOD_METRICS.encode()))})
    assert watch.status[0] == "connected" and watch.facts.running == 3, watch.status


def test_a_packed_stream_and_a_packed_error_are_bounded_too():
    res, peak = stream(packed(gzip_of_zeros(BOMB_BYTES), "gzip", "text/event-stream"))
    assert res.finish_reason == "error" and "the stream sent more than 320 KiB" in res.error, res.error
    assert peak < MAX_PEAK_BYTES

    error_bomb = packed(gzip_of_zeros(BOMB_BYTES), "gzip")
    res, peak = stream(_as_500(error_bomb))
    assert res.error.startswith("HTTP 500: ") and len(res.error) <= 320 and peak < MAX_PEAK_BYTES


def test_every_request_asks_for_the_body_as_it_is():
    routes = {"/v1/models": MODELS, "/metrics": body(GOOD_METRICS),
              "/v1/completions": sse({"choices": [{"text": "ok"}]})}
    with HostileServer(routes) as server:
        path, req = request_body("m", "Hi", max_tokens=4, temperature=0.0, chat=False)

        async def look_and_ask():
            async with httpx.AsyncClient(timeout=5.0) as client:
                await bounded.fetch(client, server.url + "/metrics", max_bytes=2**20, total_s=5.0)
                await stream_request(client, server.url, path, req, StreamResult("r"))
        asyncio.run(look_and_ask())
    assert len(server.heads) == 2
    assert all(b"\r\naccept-encoding: identity\r\n" in h.lower() for h in server.heads), server.heads


def _as_500(behaviour):
    async def send(w):
        real_write = w.write
        w.write = lambda data: real_write(data.replace(b"HTTP/1.1 200 X", b"HTTP/1.1 500 X", 1))
        await behaviour(w)
    return send
