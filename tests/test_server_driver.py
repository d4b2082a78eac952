"""The desktop app's way: the server on an engine that another thread already steps (EngineHost-like),
through AsyncEngine(driver=host). The host's own requests and the server's share the engine."""
from __future__ import annotations

import threading

import openai

from app.server import ServerThread, create_app
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.serving.async_engine import AsyncEngine


class MiniHost:
    """What EngineHost offers the server: add_request / abort that queue and wake its engine thread."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def add_request(self, prompt, params, **kw) -> str:
        rid = self.engine.add_request(prompt, params, **kw)
        self._wake.set()
        return rid

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            if self.engine.has_unfinished():
                self.engine.step()
            else:
                self._wake.wait(0.1)

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)


def test_server_on_a_hosted_engine(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=128, block_size=4))
    host = MiniHost(engine)
    aeng = AsyncEngine(engine, driver=host).start()  # start() is a no-op: the host's thread steps
    server = ServerThread(create_app(aeng, model_name="hosted"), "127.0.0.1", 0).start()
    try:
        gui_rid = host.add_request([5, 6, 7, 8], SamplingParams(max_tokens=40, ignore_eos=True))  # the app's own
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="hosted", prompt="Hello", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 6
        text = "".join(c.choices[0].text for c in client.completions.create(
            model="hosted", prompt="Hello", max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True}))
        assert text == r.choices[0].text
        assert gui_rid.startswith("req-") and aeng.num_open_streams() == 0
    finally:
        server.stop()
        aeng.shutdown()
        host.shutdown()
