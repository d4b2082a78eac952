"""A headless attach (`inferlab --attach URL --screenshot ...`) whose /metrics never parses (issue 48,
point 8): it waited the whole load timeout (600 s). A server that stays down, or keeps answering what is
not metrics, now ends the run after ATTACH_GIVE_UP_S with what is wrong in the status's words; one that
answers in time is waited for as before. Local servers on 127.0.0.1 only (tests/hostile_server.py)."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from hostile_server import HostileServer, body
from test_remote_hostile import GOOD_METRICS, MODELS

from app.gui import launch


async def cut_mid_chunk(w):
    w.write(b"HTTP/1.1 200 X\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"100\r\nvllm:num_req")
    await w.drain()


def gzip_layers(w):
    from hostile_server import packed
    return packed(b"\x1f\x8b" + bytes(30), "gzip, gzip")(w)


def wait(source, give_up_s: float, timeout: float = 20.0) -> tuple[str | None, float]:
    """wait_loaded on `source` with a window stub that is ready as soon as the source is: (its answer, s)."""
    window = SimpleNamespace(controller=SimpleNamespace(engine_ready=True))
    t0 = time.monotonic()
    answer = asyncio.run(launch.wait_loaded(window, source, timeout=timeout, give_up_s=give_up_s))
    return answer, time.monotonic() - t0


@pytest.mark.parametrize("metrics,says", [
    (cut_mid_chunk, "/metrics broke off or is not HTTP (RemoteProtocolError"),
    (gzip_layers, "packed as 'gzip, gzip'"),
    (body("<html>not metrics</html>"), "returned something else than metrics"),
], ids=["cut-mid-chunk", "gzip-in-gzip", "html"])
def test_metrics_that_never_parse_end_a_headless_run_within_seconds(qapp, metrics, says):
    from app.remote.source import RemoteSource

    with HostileServer({"/v1/models": MODELS, "/metrics": metrics}) as server:
        source = RemoteSource(server.url, scrape_hz=4.0)
        source.start()
        try:
            answer, took = wait(source, give_up_s=2.0)
        finally:
            source.shutdown()
    assert answer is not None and says in answer and answer.endswith("(for 2 s; giving up)"), answer
    assert "retrying" not in answer and took < 10.0, took


def test_a_server_that_is_not_there_ends_the_run_with_its_error(qapp):
    from app.managed.child import free_port
    from app.remote.source import RemoteSource

    source = RemoteSource(f"https://127.0.0.1:{free_port()}", scrape_hz=4.0)
    source.start()
    try:
        answer, took = wait(source, give_up_s=2.0)
    finally:
        source.shutdown()
    assert answer is not None and "ConnectError" in answer and took < 10.0, (answer, took)


def test_a_server_that_answers_is_waited_for(qapp):
    from app.remote.source import RemoteSource

    with HostileServer({"/v1/models": MODELS, "/metrics": body(GOOD_METRICS)}) as server:
        source = RemoteSource(server.url, scrape_hz=4.0)
        source.start()
        try:
            answer, _took = wait(source, give_up_s=2.0)
        finally:
            source.shutdown()
    assert answer is None and source.status[0] == "connected"
