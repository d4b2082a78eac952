"""The engine's parts keep to their contracts: commands are typed and applied one by one, knobs are
copied into the parts that use them (never shared and mutated), and one attention backend is chosen in
one place."""
from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.commands import SwapWeights

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def make(folder, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=64, block_size=4, **kw))


def test_a_failing_command_is_reported_and_loses_none_of_the_others(tiny_llama):
    eng = make(tiny_llama)
    first = eng.add_request([5, 6, 7], GREEDY)
    eng.commands.put(SwapWeights({"layers.99.mlp": None}, {"quant_format": "int8"}))  # no such module
    eng.reconfigure(max_num_seqs=3)
    second = eng.add_request([8, 9, 10, 11], GREEDY)
    with pytest.warns(RuntimeWarning, match="SwapWeights failed"):
        eng.step()
    assert eng.config.quant_format == "bf16"  # the failed swap changed nothing
    assert eng.config.max_num_seqs == 3 and eng.scheduler.config.max_num_seqs == 3
    finished = {}
    while eng.has_unfinished():
        finished.update({o.request_id: o for o in eng.step() if o.finished})
    assert [len(finished[r].token_ids) for r in (first, second)] == [6, 6]


def test_reconfigure_replaces_the_config_and_each_part_gets_its_own_knobs(tiny_llama):
    eng = make(tiny_llama, max_queue_len=5)
    given = eng.config
    eng.reconfigure(max_num_batched_tokens=7, policy="priority", max_queue_len=1, enable_chunked_prefill=False)
    eng.step()
    assert given.max_num_batched_tokens == 512 and given.policy == "fcfs"  # the caller's object is untouched
    cfg = eng.config
    assert (cfg.max_num_batched_tokens, cfg.policy, cfg.max_queue_len, cfg.enable_chunked_prefill) == (
        7, "priority", 1, False)
    knobs = eng.scheduler.config
    assert (knobs.max_num_batched_tokens, knobs.policy, knobs.enable_chunked_prefill) == (7, "priority", False)
    assert type(eng.scheduler.policy).__name__ == "PriorityFirst"


def test_abort_of_a_request_not_yet_drained_finishes_it_in_the_same_step(tiny_llama):
    eng = make(tiny_llama)
    rid = eng.add_request([5, 6, 7], GREEDY)
    eng.abort(rid)
    outs = eng.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [(rid, True, "abort")]
    assert not eng.has_unfinished() and eng.stats().num_finished == 1
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_the_attention_backend_is_chosen_once_and_reselected_when_compile_switches(tiny_llama):
    eng = make(tiny_llama, attention_backend="fast")
    backend = eng.runner.backend
    assert (backend.name, backend.reference, backend.compiled_decode, backend.native_decode) == (
        "fast", False, None, None)
    eng.reconfigure(compile=True)
    eng.step()  # applied at the top of the step (nothing runs: nothing is compiled yet)
    assert eng.model.compiled and eng.runner.backend.compiled_decode is not None
    eng.reconfigure(compile=False)
    eng.step()
    assert not eng.model.compiled and eng.runner.backend.compiled_decode is None
    assert make(tiny_llama, attention_backend="reference").runner.backend.reference
