"""One command queue (issue 25 point 4): the engine's verbs and an EngineLoop's commands share one CommandQueue,
owned by the loop when one runs the engine; requests are checked by pure validators before they are queued and
built (tokenized) when the engine takes them; app/ steps engines only through engine.drive."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.commands import AbortRequest, AddRequest, CommandQueue, Reconfigure
from engine.drive import drive
from engine.serving.commands import RunInLoop
from engine.serving.loop import EngineLoop
from engine.validation import RequestLimits, check_reconfigure, validate_request

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
LIMITS = RequestLimits(vocab_size=100, max_model_len=32)
APP = Path(__file__).resolve().parent.parent / "app"


def make(folder, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(**(dict(model=str(folder), dtype="float32", num_kv_blocks=64, block_size=4) | kw)))


def run_to_end(eng: LLMEngine) -> dict:
    finished: dict = {}
    drive(eng, on_outputs=lambda outs: finished.update({o.request_id: o for o in outs if o.finished}))
    return finished


def test_the_queue_keeps_each_senders_order_and_gives_each_owner_its_kinds():
    queue = CommandQueue()
    barrier = threading.Barrier(2)

    def send(name: str) -> None:
        barrier.wait()
        for i in range(200):
            queue.put(AbortRequest(f"{name}-{i}"))
            if i % 50 == 0:
                queue.put(RunInLoop(lambda _e: None, label=f"{name}-{i}"))

    threads = [threading.Thread(target=send, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    engine_side = queue.take((AbortRequest,))
    assert len(engine_side) == 400 and queue.has((RunInLoop,)) and not queue.has((AbortRequest,))
    for name in "ab":
        mine = [int(c.request_id.split("-")[1]) for c in engine_side if c.request_id.startswith(name)]
        assert mine == list(range(200))  # each sender's commands in the order it put them
    loop_side = queue.take((AbortRequest,), others=True)
    assert [c.label for c in loop_side if c.label.startswith("a")] == ["a-0", "a-50", "a-100", "a-150"]
    assert not queue


def test_requests_from_two_threads_arrive_in_each_threads_order(tiny_llama):
    eng = make(tiny_llama, max_num_seqs=64, num_kv_blocks=256)
    arrived: list[str] = []
    eng.add_listener(lambda ev: arrived.extend(rid for rid, _t, _n in ev.arrived))
    barrier = threading.Barrier(2)

    def send(name: str) -> None:
        barrier.wait()
        for i in range(12):
            eng.add_request([5, 6, 7 + i], GREEDY, request_id=f"{name}-{i}")

    threads = [threading.Thread(target=send, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    finished = run_to_end(eng)
    assert len(finished) == 24
    for name in "ab":
        assert [r for r in arrived if r.startswith(name)] == [f"{name}-{i}" for i in range(12)]


def test_a_loop_owns_the_one_queue_and_the_engine_submits_into_it(tiny_llama):
    eng = make(tiny_llama)
    early = eng.add_request([5, 6, 7], GREEDY)  # queued before a loop runs it: it moves to the loop's queue
    loop = EngineLoop(eng)
    outputs: dict = {}
    shared: list[bool] = []

    def watch(engine) -> None:  # runs in the loop's thread, between steps
        shared.append(engine.commands is loop.commands)

    done, attached = threading.Event(), threading.Event()

    class Collect:
        def on_engine(self, engine):
            attached.set()

        def on_error(self, failure): ...

        def on_step(self, event):
            outputs.update({o.request_id: o for o in event.outputs if o.finished})
            if {early, "late"} <= set(outputs):
                done.set()

    loop.subscribe(Collect())
    try:
        loop.start()
        assert attached.wait(30) and eng.commands is loop.commands  # the early request moved over with it
        loop.post(RunInLoop(watch))
        loop.add_request([8, 9, 10], GREEDY, request_id="late")
        assert done.wait(30) and shared == [True]
        assert outputs[early].finish_reason == outputs["late"].finish_reason == "length"
    finally:
        assert loop.stop(10)


def test_an_abort_before_the_first_step_returns_the_requests_blocks(tiny_llama):
    eng = make(tiny_llama)
    free_before = eng.block_manager.num_free_blocks
    rid = eng.add_request(list(range(5, 30)), SamplingParams(max_tokens=20, temperature=0.0))
    other = eng.add_request([5, 6, 7], GREEDY)
    eng.abort(rid)  # still in the queue: its AddRequest and this abort are taken in order
    finished = run_to_end(eng)
    assert finished[rid].finish_reason == "abort" and finished[rid].token_ids == ()
    assert finished[other].finish_reason == "length"
    assert eng.block_manager.num_used_blocks == 0 and eng.block_manager.num_free_blocks == free_before


def test_a_bad_request_fails_alone_before_it_is_queued_and_once_tokenized(tiny_llama):
    eng = make(tiny_llama, max_model_len=24)
    good = eng.add_request("Hello there", GREEDY)
    with pytest.raises(ValueError, match="context length"):  # token ids: the whole check before queueing
        eng.add_request([5] * 22, GREEDY)
    with pytest.raises(ValueError, match="empty"):
        eng.add_request("", GREEDY)
    assert len(eng.commands.pending(AddRequest)) == 1  # neither refusal was queued
    long_text = eng.add_request("hello world " * 40, GREEDY)  # its length is known once tokenized
    other = eng.add_request([5, 6, 7], GREEDY)
    finished = run_to_end(eng)
    assert finished[long_text].finish_reason == "error" and "context length" in finished[long_text].error
    assert finished[good].finish_reason == finished[other].finish_reason == "length"
    assert eng.stats().num_failed == 1 and eng.block_manager.num_used_blocks == 0


def test_a_reconfigure_is_checked_then_queued(tiny_llama):
    eng = make(tiny_llama)
    eng.reconfigure(max_num_seqs=3)
    assert [type(c) for c in eng.commands.take((Reconfigure,))] == [Reconfigure]  # queued, not applied
    assert eng.config.max_num_seqs != 3


@pytest.mark.parametrize("prompt, params, problem", [
    ([5, 6, 7], GREEDY, None),
    ("Hello", GREEDY, None),
    ("", GREEDY, "the prompt is empty"),
    ([], GREEDY, "the prompt is empty"),
    ([5, 100], GREEDY, "must lie in [0, 100)"),
    ([5, -1], GREEDY, "must lie in [0, 100)"),
    (["a"], GREEDY, "must be integers"),
    ([5] * 29, GREEDY, "prompt (29 tokens) plus max_tokens (4) exceeds the context length of 32 tokens"),
    ("Hello", SamplingParams(max_tokens=32), "prompt (at least 1 token) plus max_tokens (32) exceeds"),
])
def test_validate_request_is_a_pure_function(prompt, params, problem):
    found = validate_request(prompt, params, LIMITS)
    assert found == problem if problem is None else problem in found


def test_validate_request_reads_bad_sampling_params():
    params = SamplingParams.__new__(SamplingParams)  # bypassing __post_init__, as a careless caller might
    for k, v in dict(temperature=-1.0, top_p=1.0, top_k=0, max_tokens=4, stop=[], logprobs=None, seed=None,
                     stop_token_ids=[], ignore_eos=False).items():
        object.__setattr__(params, k, v)
    assert "temperature" in validate_request([5], params, LIMITS)


def test_check_reconfigure_normalizes_or_refuses_from_the_knob_table():
    import numpy as np

    assert dict(check_reconfigure(EngineConfig(), {"max_num_seqs": np.int64(3)})) == {"max_num_seqs": 3}
    with pytest.raises(ValueError, match="at run time"):
        check_reconfigure(EngineConfig(), {"block_size": 8})
    with pytest.raises(ValueError, match="max_num_seqs"):
        check_reconfigure(EngineConfig(), {"max_num_seqs": 0})
    with pytest.raises(ValueError, match="cannot switch speculation to 'draft'"):
        check_reconfigure(EngineConfig(), {"spec_method": "draft"})  # a draft model loads only at start-up
    assert check_reconfigure(EngineConfig(), {"spec_method": "ngram"})["spec_method"] == "ngram"


def _step_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "step"]


def test_app_steps_engines_only_through_drive():
    """No measurement driver in app/ writes its own step loop: they all call engine.drive.drive."""
    found = {str(p.relative_to(APP.parent)): lines for p in sorted(APP.rglob("*.py")) if (lines := _step_calls(p))}
    assert found == {}
