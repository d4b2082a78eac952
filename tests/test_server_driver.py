"""The desktop app's way: the server subscribes to an EngineLoop that the app already runs (one thread
steps the engine), through AsyncEngine(loop=...). The app's own requests and the server's share it."""
from __future__ import annotations

import openai

from app.server import ServerThread, create_app
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.serving.async_engine import AsyncEngine
from engine.serving.loop import EngineLoop


def test_server_on_a_shared_engine_loop(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=128, block_size=4))
    loop = EngineLoop(engine).start()  # the app's loop
    aeng = AsyncEngine(loop=loop).start()  # start() only subscribes: the loop's thread steps
    server = ServerThread(create_app(aeng, model_name="hosted"), "127.0.0.1", 0).start()
    try:
        gui_rid = loop.add_request([5, 6, 7, 8], SamplingParams(max_tokens=40, ignore_eos=True))  # the app's own
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
        assert loop.stop(5)
