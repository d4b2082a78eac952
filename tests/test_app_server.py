"""The desktop app serves the OpenAI API on its own engine: an external request shows in its panels."""
from __future__ import annotations

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
    latency = window.panels["latency"].snapshot_data()
    assert latency and any(v for v in latency.values() if isinstance(v, (int, float)))
    window.actions_by_name["serve"].trigger()
    assert not window.server.running
