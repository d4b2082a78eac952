"""The engine API from several threads (issue 26, class 1): generate() from many threads at once returns
each caller its own answers; add_request after a shutdown or stop is refused at once; a reconfigure with a
value of the wrong type or range is refused and the engine keeps serving; a LoRA adapter removed just after
a request for it was queued still serves that request and refuses the next."""
from __future__ import annotations

import asyncio
import threading

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.serving.async_engine import AsyncEngine
from engine.serving.loop import EngineLoop, EngineUnavailable, Subscriber
from tests.lora_helpers import make_adapter

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
JOIN_S = 60  # a hang shows as a thread still alive after this, never as a stuck suite


def make(folder, **kw) -> LLMEngine:
    cfg = dict(model=str(folder), dtype="float32", num_kv_blocks=96, block_size=4) | kw
    return LLMEngine(EngineConfig(**cfg))


def test_generate_from_four_threads_returns_each_its_own_greedy_answers(tiny_llama):
    eng = make(tiny_llama)
    prompts = [[[5 + t, 6, 7 + i] for i in range(3)] for t in range(4)]
    alone = [[o.token_ids for o in eng.generate(p, GREEDY)] for p in prompts]
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def call(t: int) -> None:
        try:
            results[t] = [o.token_ids for o in eng.generate(prompts[t], GREEDY)]
        except BaseException as exc:  # noqa: BLE001 (reported by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(t,), daemon=True) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(JOIN_S)
    assert not any(th.is_alive() for th in threads), "generate() from several threads never returned"
    assert errors == []
    assert [results[t] for t in range(4)] == alone
    assert not eng.has_unfinished()


def test_add_request_after_loop_stop_is_refused_at_once(tiny_llama):
    loop = EngineLoop(make(tiny_llama)).start()
    assert loop.stop(5)
    with pytest.raises(EngineUnavailable, match="stopped"):
        loop.add_request([5, 6, 7], GREEDY)


def test_a_request_left_in_a_stopped_loop_ends_with_abort(tiny_llama):
    eng = make(tiny_llama)
    finished = []
    eng.add_listener(lambda ev: finished.extend((t.request_id, t.finish_reason) for t in ev.finished))
    loop = EngineLoop(eng)
    attached = threading.Event()
    loop.subscribe(type("Attached", (Subscriber,), {"on_engine": lambda self, e: attached.set()})())
    assert loop.start() and attached.wait(JOIN_S)
    rid = loop.add_request([5, 6, 7], SamplingParams(max_tokens=240, ignore_eos=True))
    assert loop.stop(10)  # long before its 240 tokens
    assert finished == [(rid, "abort")]
    assert not eng.has_unfinished()


def test_add_request_after_async_shutdown_is_refused_at_once(tiny_llama):
    aeng = AsyncEngine(make(tiny_llama)).start()
    aeng.shutdown(5)

    async def add():
        return aeng.add_request([5, 6, 7], GREEDY)

    with pytest.raises(EngineUnavailable, match="shut down"):
        asyncio.run(asyncio.wait_for(add(), JOIN_S))
    assert aeng.num_open_streams() == 0


def test_async_front_on_a_shared_loop_refuses_after_shutdown_and_serves_after_start(tiny_llama):
    loop = EngineLoop(make(tiny_llama)).start()
    aeng = AsyncEngine(loop=loop).start()
    aeng.shutdown()

    async def run():
        with pytest.raises(EngineUnavailable):
            aeng.add_request([5, 6, 7], GREEDY)
        aeng.start()
        return await asyncio.wait_for(aeng.add_request([5, 6, 7], GREEDY).result(), JOIN_S)

    try:
        assert len(asyncio.run(run()).token_ids) == GREEDY.max_tokens
    finally:
        aeng.shutdown()
        assert loop.stop(5)


@pytest.mark.parametrize("knobs", [
    {"max_num_seqs": 2.5}, {"max_num_batched_tokens": "64"}, {"max_num_seqs": True}, {"max_num_seqs": 0},
    {"enable_chunked_prefill": "no"}, {"fused_decode": 1}, {"compile": None}, {"policy": 3},
    {"max_queue_len": -1}, {"max_queue_len": 1.5}, {"max_predicted_wait_s": float("nan")},
    {"max_predicted_wait_s": float("inf")}, {"max_predicted_wait_s": -1.0}, {"num_speculative_tokens": 9},
    {"num_speculative_tokens": 2.0}, {"spec_method": 1},
])
def test_a_reconfigure_of_the_wrong_type_or_range_is_refused_and_the_engine_keeps_serving(tiny_llama, knobs):
    eng = make(tiny_llama)
    before = eng.generate([5, 6, 7], GREEDY)[0].token_ids
    with pytest.raises(ValueError, match=next(iter(knobs))):
        eng.reconfigure(**knobs)
    assert eng.generate([5, 6, 7], GREEDY)[0].token_ids == before


def test_good_reconfigure_values_are_stored_as_plain_types(tiny_llama):
    import numpy as np

    eng = make(tiny_llama)
    eng.reconfigure(max_num_seqs=np.int64(3), max_predicted_wait_s=2, max_queue_len=None)
    eng.step()
    assert type(eng.config.max_num_seqs) is int and eng.scheduler.config.max_num_seqs == 3
    assert type(eng.config.max_predicted_wait_s) is float
    assert eng.config.max_queue_len is None


def test_an_adapter_removed_after_its_request_was_queued_still_serves_it_and_refuses_the_next(tiny_llama, tmp_path):
    """The adapter's name is resolved under the command queue's lock, so a remove_lora lands after a
    request already queued for it (which runs with it) and before any later one (refused at once). (Until
    the one queue, the request was tokenized in the caller's thread and could be caught by a removal
    mid-way; that window is gone.)"""
    eng = make(tiny_llama, max_loras=1)
    eng.add_lora("a", str(make_adapter(tiny_llama, tmp_path / "a")))
    base = eng.add_request([5, 6, 7], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    eng.step()
    queued = eng.add_request([8, 9, 10], GREEDY, lora_name="a")
    eng.remove_lora("a")  # queued after the request: the request keeps its adapter
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        eng.add_request([8, 9, 10], GREEDY, lora_name="a")
    finished = {}
    while eng.has_unfinished():
        finished.update({o.request_id: o for o in eng.step() if o.finished})
    assert finished[base].finish_reason == "length"
    assert finished[queued].finish_reason == "length" and finished[queued].lora_name == "a"
    assert eng.generate([5, 6, 7], GREEDY)[0].finish_reason == "length"  # base requests still run
