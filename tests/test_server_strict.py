"""Protocol strictness (issue 26, class 5): a `model` that names no loaded adapter is a 404 as in vLLM and
OpenAI; fields the server would silently ignore are 400s; a connection that never sends a whole request
head is closed after the header timeout."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from lora_helpers import make_adapter
from server_helpers import MODEL_NAME, serving

from app.server import ServerThread, create_app
from engine import EngineConfig, LLMEngine
from engine.serving.async_engine import AsyncEngine

CHAT = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    adapter = make_adapter(tiny_llama, tmp_path_factory.mktemp("strict") / "style", rank=4)
    with serving(tiny_llama, max_loras=1) as (server, engine, _aeng):
        engine.add_lora("style", str(adapter))
        yield server, engine, str(adapter)


@pytest.mark.parametrize("route,body", [
    ("completions", {"prompt": [5, 6, 7], "max_tokens": 2}),
    ("completions", {"prompt": [5, 6, 7], "max_tokens": 2, "stream": True}),
    ("chat/completions", {"messages": CHAT, "max_tokens": 2}),
])
def test_a_model_that_names_no_adapter_is_a_404(server, route, body):
    srv, _engine, _path = server
    for model in ("tiny-lama", "style ", "STYLE"):
        reply = httpx.post(f"{srv.url}/v1/{route}", json={"model": model, **body}, timeout=30)
        assert reply.status_code == 404, (model, reply.text)
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("not_found_error", "model_not_found", "model")
    for model in (MODEL_NAME, "style", None):  # the served name, an adapter, or no model: served
        reply = httpx.post(f"{srv.url}/v1/{route}", json={"model": model, **body}, timeout=30)
        assert reply.status_code == 200, (model, reply.text)


def test_an_adapter_just_unloaded_is_a_404(server, tmp_path, tiny_llama):
    srv, engine, path = server
    engine.add_lora("brief", path)
    body = {"model": "brief", "prompt": [5, 6, 7], "max_tokens": 2}
    assert httpx.post(f"{srv.url}/v1/completions", json=body, timeout=30).status_code == 200
    engine.remove_lora("brief")
    assert httpx.post(f"{srv.url}/v1/completions", json=body, timeout=30).status_code == 404


@pytest.mark.parametrize("extra,param", [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "none"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 2, "logprobs": False}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages"),
    ({"messages": [{"role": "", "content": "Hello"}]}, "messages.0.role"),
    ({"messages": [{"role": "  ", "content": "Hello"}]}, "messages.0.role"),
])
def test_fields_that_would_be_ignored_are_400s(server, extra, param):
    srv, _engine, _path = server
    body = {"model": MODEL_NAME, "messages": CHAT, "max_tokens": 2} | extra
    reply = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_the_same_fields_used_rightly_are_served(server):
    srv, _engine, _path = server
    body = {"model": MODEL_NAME, "max_tokens": 2, "logprobs": True, "top_logprobs": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hel"},
                                                      {"type": "text", "text": "lo"}]}]}
    reply = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text


@pytest.fixture(scope="module")
def quick_timeout_server(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))
    aeng = AsyncEngine(engine).start()
    server = ServerThread(create_app(aeng, model_name=MODEL_NAME), "127.0.0.1", 0, header_timeout_s=1.0,
                          body_timeout_s=1.0).start()
    yield server
    server.stop()
    aeng.shutdown()


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """Whether the server closes the connection within `seconds` while we send `trickle`, a byte a 0.2 s."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.2)
    pending = list(trickle)
    while time.monotonic() < deadline:
        if pending:
            try:
                sock.send(bytes([pending.pop(0)]))
            except OSError:
                return True
        try:
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def test_an_idle_connection_is_closed_after_the_header_timeout(quick_timeout_server):
    with socket.create_connection(("127.0.0.1", quick_timeout_server.port)) as sock:
        assert _closed_within(sock, 6.0)


def test_a_header_sent_a_byte_at_a_time_is_cut_off(quick_timeout_server):
    with socket.create_connection(("127.0.0.1", quick_timeout_server.port)) as sock:
        assert _closed_within(sock, 6.0, trickle=b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40)


def test_a_completion_whose_body_stalls_is_closed_and_the_next_is_served(quick_timeout_server):
    with socket.create_connection(("127.0.0.1", quick_timeout_server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200\r\n\r\n{")
        assert _closed_within(sock, 6.0)
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
    assert httpx.post(f"{quick_timeout_server.url}/v1/completions", json=body, timeout=30).status_code == 200


def test_a_prompt_request_on_the_same_server_is_served(quick_timeout_server):
    with httpx.Client(timeout=30) as client:  # keep-alive: the second request's head gets its own deadline
        for _ in range(2):
            assert client.get(f"{quick_timeout_server.url}/health").status_code == 200
            time.sleep(0.6)
        assert client.get(f"{quick_timeout_server.url}/health").status_code == 200
