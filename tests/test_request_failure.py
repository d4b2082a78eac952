"""One request's failure is its own (issue 12, point 2), by fault injection: a forward pass that raises
for one request, or logits with NaN / inf in one row, fails that request alone (finish_reason "error"
and a reason), never the batch and never with a silent token; the others finish as they would have;
the failure is counted in EngineStats, the step's event and the Prometheus metrics."""
from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.serving.prometheus import ServingMetrics

PROMPTS = [[5, 17, 42, 99, 7], [8, 9, 10], [100, 101, 102, 103], [250, 12, 33, 44, 55, 66]]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
POISON = 8  # the first token of the prompt whose rows are poisoned


def make(folder) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=64, block_size=4))


def run(eng: LLMEngine, params: SamplingParams) -> tuple[dict, list]:
    events = []
    eng.add_listener(events.append)
    ids = [eng.add_request(p, params) for p in PROMPTS]
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    eng.remove_listener(events.append)
    return {i: done[rid] for i, rid in enumerate(ids)}, events


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return {params.temperature: run(make(tiny_llama), params)[0] for params in (GREEDY, SAMPLED)}


def poison_logits(eng: LLMEngine, value: float) -> None:
    """compute_logits puts `value` into one logit of every row of the poisoned request: the model
    runner learns which rows those are from the hidden states, so mark them by the request's order."""
    runner = eng.runner
    real_execute, real_logits = runner.execute, eng.model.compute_logits
    poisoned_rows: list[int] = []

    def execute(sched, bm):
        order = sorted((s for s in sched.scheduled if s.kind == "decode"), key=lambda s: s.request.num_tokens)
        order += [s for s in sched.scheduled if s.kind != "decode"]
        poisoned_rows.clear()
        producing = [s for s in order if s.request.num_computed_tokens + s.num_tokens == s.request.num_tokens]
        poisoned_rows.extend(i for i, s in enumerate(producing) if s.request.prompt_token_ids[0] == POISON)
        return real_execute(sched, bm)

    def compute_logits(hidden):
        logits = real_logits(hidden)
        if poisoned_rows and logits.shape[0] > max(poisoned_rows):
            logits[poisoned_rows, 3] = value
        return logits

    runner.execute = execute
    eng.model.compute_logits = compute_logits


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_nonfinite_logits_fail_one_request_alone(tiny_llama, reference, value, params):
    eng = make(tiny_llama)
    poison_logits(eng, value)
    outs, events = run(eng, params)
    bad = outs[1]
    assert bad.finish_reason == "error" and "non-finite logits" in bad.error
    assert bad.token_ids == ()  # never a silent token (greedy argmax over NaN was token 0)
    for i in (0, 2, 3):
        assert outs[i].finish_reason == "length"
        assert outs[i].token_ids == reference[params.temperature][i].token_ids
    assert eng.stats().num_failed == 1
    assert sum(e.stats.num_failed for e in events) == 1
    assert eng.block_manager.num_used_blocks == 0


def test_forward_that_raises_for_one_request_fails_it_alone(tiny_llama, reference):
    eng = make(tiny_llama)
    real_forward = eng.runner.forward
    calls = {"batches": 0}

    def forward(order, bm):
        if any(s.request.prompt_token_ids[0] == POISON for s in order):
            calls["batches"] += 1
            raise RuntimeError("injected fault")
        return real_forward(order, bm)

    eng.runner.forward = forward
    metrics = ServingMetrics(eng, "tiny").attach()
    outs, events = run(eng, GREEDY)
    assert calls["batches"] >= 2  # the whole batch once, then the request alone
    assert outs[1].finish_reason == "error" and outs[1].error == "RuntimeError: injected fault"
    for i in (0, 2, 3):
        assert outs[i].finish_reason == "length" and outs[i].token_ids == reference[0.0][i].token_ids
    assert eng.stats().num_failed == 1 and sum(e.stats.num_failed for e in events) == 1
    text = metrics.render()
    assert 'inferlab:request_failed_total{model_name="tiny"} 1.0' in text
    assert eng.block_manager.num_used_blocks == 0 and not eng.scheduler.has_unfinished()


def test_a_failed_batch_where_every_request_fails_ends_each_once(tiny_llama):
    eng = make(tiny_llama)

    def forward(order, bm):
        raise MemoryError("no memory for this batch")

    eng.runner.forward = forward
    outs, events = run(eng, GREEDY)
    assert all(o.finish_reason == "error" and "MemoryError" in o.error for o in outs.values())
    assert sum(len(e.finished) for e in events) == len(PROMPTS)
    assert eng.stats().num_failed == len(PROMPTS) and eng.block_manager.num_used_blocks == 0


def test_a_failed_request_leaves_no_nan_in_the_kv_cache(tiny_llama):
    """The slots a failed request wrote are zeroed: a padded decode gather of another request reads
    whole blocks, and 0 attention weight times a stale NaN is still NaN."""
    eng = make(tiny_llama)
    real_forward = eng.runner.forward

    def forward(order, bm):
        hidden = real_forward(order, bm)
        for k, v in eng.runner.kv_caches:  # as a model that overflowed would leave them
            for s in order:
                if s.request.prompt_token_ids[0] == POISON:
                    table = bm.block_table(s.request.request_id)
                    k[:, table[0] * 4: table[0] * 4 + 3] = math.nan
                    v[:, table[0] * 4: table[0] * 4 + 3] = math.nan
        return hidden

    eng.runner.forward = forward
    poison_logits(eng, math.nan)
    outs, _ = run(eng, GREEDY)
    assert outs[1].finish_reason == "error"
    assert not any(torch.isnan(k).any() or torch.isnan(v).any() for k, v in eng.runner.kv_caches)


def test_a_failed_request_leaves_nothing_in_the_prefix_cache(tiny_llama):
    """Its prompt's blocks were committed chunk by chunk before its logits turned out NaN: a later
    request with the same prompt must not be served those K/V from the cache."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4,
                                 max_num_batched_tokens=8))
    prompt = [POISON] + list(range(20, 39))  # 20 tokens: three chunks of <= 8, five full blocks
    poison_logits(eng, math.nan)
    bad = eng.generate([prompt], GREEDY)[0]
    assert bad.finish_reason == "error"
    eng.model.compute_logits = type(eng.model).compute_logits.__get__(eng.model)  # healthy again
    eng.runner.execute = type(eng.runner).execute.__get__(eng.runner)
    rid = eng.add_request(prompt, GREEDY)
    eng.step()
    assert eng.scheduler.running[0].request_id == rid and eng.scheduler.running[0].num_cached_tokens == 0
    while eng.has_unfinished():
        eng.step()
    assert eng.block_manager.num_used_blocks == 0


def test_a_request_whose_own_processing_raises_fails_alone(tiny_llama, reference, monkeypatch):
    """Its detokenizer (or stop check, or verification) raising is its own failure, not the step's."""
    import engine.llm_engine as llm_engine

    real_append = llm_engine.append_token

    def append_token(req, token, *args):
        if req.prompt_token_ids[0] == POISON and req.num_output_tokens == 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real_append(req, token, *args)

    monkeypatch.setattr(llm_engine, "append_token", append_token)
    eng = make(tiny_llama)
    outs, events = run(eng, GREEDY)
    assert outs[1].finish_reason == "error" and "UnicodeDecodeError" in outs[1].error
    for i in (0, 2, 3):
        assert outs[i].finish_reason == "length" and outs[i].token_ids == reference[0.0][i].token_ids
    assert eng.stats().num_failed == 1 and sum(e.stats.num_failed for e in events) == 1
    assert eng.block_manager.num_used_blocks == 0 and not eng.scheduler.has_unfinished()
