"""Tokenizing never runs on the GUI thread (issue 25 point 4): a prompt submitted from the app's host is
rendered through the chat template and tokenized in the engine thread; the HTTP server tokenizes in a worker
thread (asyncio.to_thread), never on its event loop, and the engine gets token ids."""
from __future__ import annotations

import asyncio
import threading
import time

from app.host.engine_host import EngineHost
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.events import EngineStepEvent

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


class RecordingTokenizer:
    """The engine's tokenizer, noting the thread (and whether an event loop runs there) of each heavy call."""

    HEAVY = ("encode", "apply_chat_template", "encode_chat")  # encode_chat renders the template and encodes it

    def __init__(self, inner) -> None:
        self._inner = inner
        self.calls: list[tuple[str, threading.Thread, bool]] = []

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name not in self.HEAVY:
            return value

        def recorded(*args, **kw):
            self.calls.append((name, threading.current_thread(), _event_loop_running()))
            return value(*args, **kw)

        return recorded


def _event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def recording_engine(folder) -> tuple[LLMEngine, RecordingTokenizer]:
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=128, block_size=4))
    tok = RecordingTokenizer(eng.tokenizer)
    eng.tokenizer = eng.intake.tokenizer = tok
    return eng, tok


def wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not predicate() and time.perf_counter() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_prompt_from_the_gui_is_tokenized_in_the_engine_thread(qapp, tiny_llama):
    eng, tok = recording_engine(tiny_llama)
    host = EngineHost(eng.config, engine=eng)
    host.start()
    try:
        assert wait_for(lambda: host.info is not None)
        tok.calls.clear()  # what loading and the load generator's set-up did is not the point here
        gui = threading.current_thread()
        rid, templated = host.submit_prompt("Hello there", PARAMS, chat=True)  # as the controller calls it
        assert templated and tok.calls == []  # nothing tokenized in this (the GUI) thread
        done: list[EngineStepEvent] = []
        assert wait_for(lambda: done.extend(e for e in host.drain() if isinstance(e, EngineStepEvent)) or
                        any(o.request_id == rid and o.finished for e in done for o in e.outputs))
        final = next(o for e in done for o in e.outputs if o.request_id == rid and o.finished)
        names = [name for name, _t, _l in tok.calls]
        assert "apply_chat_template" in names and "encode" in names
        assert {t for _n, t, _l in tok.calls} == {host.loop.thread} and gui not in {t for _n, t, _l in tok.calls}
        rendered = eng.tokenizer._inner.apply_chat_template([{"role": "user", "content": "Hello there"}])
        assert final.num_prompt_tokens == len(eng.tokenizer._inner.encode(rendered))  # as the host rendered it
    finally:
        assert host.shutdown(10)


def test_the_http_server_tokenizes_off_its_event_loop(tiny_llama):
    from fastapi.testclient import TestClient

    from app.server import create_app
    from engine.serving.async_engine import AsyncEngine

    eng, tok = recording_engine(tiny_llama)
    aeng = AsyncEngine(eng).start()
    try:
        with TestClient(create_app(aeng, model_name="tiny")) as client:
            tok.calls.clear()
            for path, body in (("/v1/completions", {"prompt": "Hello there"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
                r = client.post(path, json={"model": "tiny", "max_tokens": 3, "temperature": 0, **body})
                assert r.status_code == 200, r.text
        assert {name for name, _t, _l in tok.calls} == {"encode", "encode_chat"}
        assert not any(in_loop for _n, _t, in_loop in tok.calls)  # never on the event loop
        assert threading.main_thread() not in {t for _n, t, _l in tok.calls}
    finally:
        aeng.shutdown()
