"""EngineLoop: one thread steps the engine, typed commands dispatched by type (a bad one fails alone),
step events fanned out to every subscriber, and every subscriber re-attached to a rebuilt engine."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.serving.async_engine import AsyncEngine
from engine.serving.commands import Rebuild, RunInLoop
from engine.serving.loop import EngineLoop, EngineUnavailable, FailureKind, Subscriber

WAIT_S = 30


class Recorder(Subscriber):
    def __init__(self) -> None:
        self.engines: list = []
        self.finished: list[str] = []
        self.failures: list = []
        self.changed = threading.Event()

    def on_engine(self, engine) -> None:
        self.engines.append(engine)
        self.changed.set()

    def on_step(self, event) -> None:
        self.finished.extend(t.request_id for t in event.finished)
        if event.finished:
            self.changed.set()

    def on_error(self, failure) -> None:
        self.failures.append(failure)
        self.changed.set()


def wait_for(predicate, rec: Recorder) -> None:
    deadline = threading.Event()
    timer = threading.Timer(WAIT_S, deadline.set)
    timer.start()
    try:
        while not predicate():
            assert not deadline.is_set(), "condition not met in time"
            rec.changed.wait(0.05)
            rec.changed.clear()
    finally:
        timer.cancel()


@pytest.fixture
def loop(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))
    loop = EngineLoop(engine)
    yield loop
    assert loop.stop(5)


@dataclass(frozen=True, slots=True)
class Explode:
    why: str


@dataclass(frozen=True, slots=True)
class Unhandled:
    pass


def test_a_bad_command_fails_alone_and_the_loop_goes_on(loop):
    rec = loop.subscribe(Recorder())
    ran = []
    loop.handle(Explode, lambda c: (_ for _ in ()).throw(ValueError(c.why)))
    loop.start()
    loop.post(Explode("broken on purpose"))
    loop.post(Unhandled())
    loop.post(RunInLoop(lambda engine: ran.append(engine)))
    rid = loop.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    wait_for(lambda: rid in rec.finished and ran, rec)
    kinds = [f.kind for f in rec.failures]
    assert kinds == [FailureKind.COMMAND, FailureKind.COMMAND]
    assert "Explode" in rec.failures[0].message and "broken on purpose" in rec.failures[0].message
    assert "Unhandled" in rec.failures[1].message
    assert ran == [loop.engine]  # the command after the bad ones ran, in the loop, on its engine


def test_every_subscriber_is_reattached_after_a_rebuild(loop):
    first, second = Recorder(), Recorder()
    loop.subscribe(first)
    loop.start()
    wait_for(lambda: first.engines, first)
    loop.subscribe(second)  # late: its on_engine runs at once
    old = loop.engine
    assert first.engines == [old] and second.engines == [old]
    busy = loop.add_request([5, 6, 7], SamplingParams(max_tokens=10_000 // 100, ignore_eos=True))
    loop.post(Rebuild({"num_kv_blocks": 96}))
    wait_for(lambda: len(first.engines) == 2 and len(second.engines) == 2, first)
    new = loop.engine
    assert new is not old and new.config.num_kv_blocks == 96
    assert first.engines[-1] is new and second.engines[-1] is new
    assert busy in first.finished  # the old engine's request ended (aborted) before the swap
    rid = loop.add_request([8, 9, 10], SamplingParams(max_tokens=3, ignore_eos=True))
    wait_for(lambda: rid in first.finished and rid in second.finished, first)  # both hear the new engine


def test_a_failed_rebuild_keeps_the_old_engine(loop):
    rec = loop.subscribe(Recorder())
    loop.start()
    wait_for(lambda: rec.engines, rec)
    old = loop.engine
    loop.post(Rebuild({"block_size": 3}))  # not a power of two: EngineConfig refuses it
    wait_for(lambda: len(rec.engines) == 2, rec)
    assert loop.engine is old and rec.engines == [old, old]
    assert [f.kind for f in rec.failures] == [FailureKind.REBUILD]
    rid = loop.add_request([5, 6], SamplingParams(max_tokens=2, ignore_eos=True))
    wait_for(lambda: rid in rec.finished, rec)


def test_requests_are_refused_until_an_engine_is_attached(tiny_llama):
    loop = EngineLoop(config=EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64))
    with pytest.raises(EngineUnavailable, match="still loading"):
        loop.add_request("hi", SamplingParams(max_tokens=2))
    rec = loop.subscribe(Recorder())
    loop.start()
    try:
        wait_for(lambda: rec.engines, rec)
        rid = loop.add_request([5, 6], SamplingParams(max_tokens=2, ignore_eos=True))
        wait_for(lambda: rid in rec.finished, rec)
    finally:
        assert loop.stop(5)


def test_async_front_follows_a_rebuilt_engine(loop):
    aeng = AsyncEngine(loop=loop).start()
    rec = loop.subscribe(Recorder())
    loop.start()
    wait_for(lambda: rec.engines, rec)

    async def generate() -> str:
        stream = aeng.add_request([5, 6, 7], SamplingParams(max_tokens=5, ignore_eos=True))
        return (await stream.result()).finish_reason

    try:
        assert asyncio.run(generate()) == "length"
        loop.post(Rebuild({"num_kv_blocks": 80}))
        wait_for(lambda: len(rec.engines) == 2, rec)
        assert aeng.engine is loop.engine and aeng.engine.config.num_kv_blocks == 80
        assert asyncio.run(generate()) == "length"  # streamed from the new engine
    finally:
        aeng.shutdown()


def test_outputs_carry_the_per_request_figures_the_gui_shows(loop):
    """TTFT and tokens/s are computed once, in the engine, on each RequestOutput."""
    engine = loop.engine
    seen = []
    engine.add_listener(lambda ev: seen.extend(ev.outputs))
    engine.generate([[5, 6, 7]], SamplingParams(max_tokens=5, ignore_eos=True))
    first, last = seen[0], seen[-1]
    assert first.ttft_s is not None and first.ttft_s > 0 and first.tokens_per_s is None  # one token so far
    assert last.finished and last.ttft_s == first.ttft_s and last.tokens_per_s > 0
