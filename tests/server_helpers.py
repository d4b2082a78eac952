"""A live `inferlab serve` stack on the tiny model for the server tests: engine thread + uvicorn thread."""
from __future__ import annotations

import contextlib
import json
import time

from app.server import ServerThread, create_app
from engine import EngineConfig, LLMEngine
from engine.serving.async_engine import AsyncEngine

MODEL_NAME = "tiny-llama"


@contextlib.contextmanager
def serving(folder, api_key: str | None = None, **engine_kw):
    engine_kw.setdefault("num_kv_blocks", 256)
    engine_kw.setdefault("block_size", 4)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_threads=1, **engine_kw))
    aeng = AsyncEngine(engine).start()
    server = ServerThread(create_app(aeng, model_name=MODEL_NAME, api_key=api_key), "127.0.0.1", 0).start()
    try:
        yield server, engine, aeng
    finally:
        server.stop()
        aeng.shutdown()


def sse_events(lines) -> list:
    """Parse an SSE body (an iterable of lines): the JSON payloads, and "[DONE]" as a string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.005) -> bool:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
