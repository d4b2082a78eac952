"""The desktop app serves the OpenAI API on its own engine: an external request shows in its panels."""
from __future__ import annotations

import json

import httpx
import pytest
from app_helpers import close_window, open_window, run_for, wait_until


@pytest.fixture
def window(qapp, tiny_llama):
    w = open_window(tiny_llama)
    w.server.port = 0  # any free port
    yield w
    close_window(w)


def test_server_menu_serves_on_the_app_engine(qapp, window):
    window.actions_by_name["serve"].trigger()
    assert window.server.running, window.status_label.text()
    url = window.server.url
    finished = []
    window.host.engine.add_listener(lambda ev: finished.extend(t.request_id for t in ev.finished))
    with httpx.Client(timeout=30) as client:
        reply = client.post(f"{url}/completions", json={"prompt": "Hello world", "max_tokens": 5,
                                                         "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 5
    wait_until(qapp, lambda: finished, 10)
    run_for(qapp, 0.5)  # the panels drain the host's events
    latency = window.panels.latency.snapshot_data()
    assert latency and any(v for v in latency.values() if isinstance(v, (int, float)))
    window.actions_by_name["serve"].trigger()
    assert not window.server.running


def _stream_text(url: str) -> tuple[int, str]:
    """A streamed completion over HTTP: (tokens, text)."""
    body = {"prompt": "Hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    text, usage = "", None
    with httpx.Client(timeout=30) as client, client.stream("POST", f"{url}/completions", json=body) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: "):])
                text += "".join(c["text"] for c in chunk["choices"])
                usage = chunk.get("usage") or usage
    return usage["completion_tokens"], text


def test_server_keeps_streaming_after_a_preset_rebuilds_the_engine(qapp, window):
    window.actions_by_name["serve"].trigger()
    assert window.server.running, window.status_label.text()
    url = window.server.url
    assert _stream_text(url)[0] == 6
    old = window.host.engine
    assert window.controller.apply_preset("vram-bottleneck"), window.controller.last_error  # 160 KV blocks
    wait_until(qapp, lambda: window.controller.engine_ready and window.host.engine is not old, 60)
    assert window.host.info.num_kv_blocks == 160 and window.host.engine.config.num_kv_blocks == 160
    old = None  # the old engine is garbage now (collected in this, the GUI thread)
    window.host.stop_load()  # the preset's own load would only slow this test down
    served = []
    window.host.engine.add_listener(lambda ev: served.extend(t.num_output_tokens for t in ev.finished))
    n, text = _stream_text(url)  # the same server, now on the rebuilt engine
    assert n == 6 and text
    assert 6 in served  # the new engine produced them
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert "inferlab:generation_tokens_total" in metrics
    window.actions_by_name["serve"].trigger()
    assert not window.server.running
