"""The engine's promises on a tiny random model: batching, chunking, caching and preemption never change
what a request produces, and a bad request is refused alone."""
from __future__ import annotations

import math

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams

PROMPTS = [
    [5, 17, 42, 99, 7, 250, 3, 64, 128, 11, 300, 21, 8, 77, 91, 150, 33, 12, 200, 45, 6, 9, 10],
    [8, 9, 10],
    [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118],
    [250, 12, 33, 44, 55, 66, 77],
    list(range(20, 61)),
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def make(folder, **kw) -> LLMEngine:
    kw.setdefault("num_kv_blocks", 128)
    kw.setdefault("block_size", 4)
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", **kw))


def one_at_a_time(folder, prompts, params=GREEDY):
    eng = make(folder)
    return [eng.generate([p], params)[0].token_ids for p in prompts]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return one_at_a_time(tiny_llama, PROMPTS)


def test_batched_equals_one_at_a_time(tiny_llama, reference):
    eng = make(tiny_llama)
    outs = eng.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.finish_reason == "length" and len(o.token_ids) == 16 for o in outs)
    # every step after the first mixes several requests
    assert eng.stats().num_steps < sum(len(r) for r in reference)


def test_chunked_prefill_equals_unchunked(tiny_llama, reference):
    events = []
    eng = make(tiny_llama, max_num_batched_tokens=7)
    eng.add_listener(events.append)
    outs = eng.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert max(e.stats.num_tokens for e in events) <= 7
    # a chunk of a long prompt shares a step with decodes of others: decodes never stall
    assert any(e.stats.num_prefill_tokens and e.stats.num_decode_tokens for e in events)


def test_prefix_cache_hit_equals_miss(tiny_llama):
    system = list(range(30, 62))  # 32 tokens = 8 full blocks of 4
    prompts = [system + [7, 8, 9], system + [11, 12]]
    cold = make(tiny_llama, enable_prefix_caching=False)
    expected = [cold.generate([p], GREEDY)[0].token_ids for p in prompts]
    eng = make(tiny_llama)
    first = eng.generate([prompts[0]], GREEDY)[0]
    assert eng.stats().num_prefix_cache_hit_tokens == 0
    second = eng.generate([prompts[1]], GREEDY)[0]
    assert eng.stats().num_prefix_cache_hit_tokens == 32
    assert [first.token_ids, second.token_ids] == expected


def test_shared_prefix_is_stored_once(tiny_llama):
    system = list(range(30, 62))
    eng = make(tiny_llama)
    eng.generate([system + [1]], SamplingParams(max_tokens=1, temperature=0.0))
    eng.add_request(system + [7, 8, 9], GREEDY)
    eng.add_request(system + [11, 12], GREEDY)
    eng.step()
    snap = eng.block_map()
    tables = list(snap.block_tables.values())
    assert tables[0][:8] == tables[1][:8]
    shared = {b.block_id for b in snap.blocks if b.ref_count == 2}
    assert shared == set(tables[0][:8])


def test_preempted_request_produces_same_tokens(tiny_llama, reference):
    # 5 requests need up to (41+16)/4 blocks each; 24 blocks force preemption by recompute.
    eng = make(tiny_llama, num_kv_blocks=24)
    outs = eng.generate(PROMPTS, GREEDY)
    assert eng.stats().num_preemptions > 0
    assert [o.token_ids for o in outs] == reference
    assert eng.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("bad", [
    dict(prompt=""),
    dict(prompt=[]),
    dict(prompt=[1] * 200, params=SamplingParams(max_tokens=100)),
    dict(prompt=[1, 2], params=SamplingParams.__new__(SamplingParams)),
])
def test_bad_requests_are_refused_alone(tiny_llama, bad):
    eng = make(tiny_llama)
    good = eng.add_request(PROMPTS[1], GREEDY)
    params = bad.get("params", GREEDY)
    if not hasattr(params, "max_tokens"):  # a params object bypassing __post_init__ with bad values
        for k, v in dict(temperature=-1.0, top_p=1.0, top_k=0, max_tokens=4, stop=[], logprobs=None,
                         seed=None, stop_token_ids=[], ignore_eos=False).items():
            object.__setattr__(params, k, v)
    with pytest.raises(ValueError):
        eng.add_request(bad["prompt"], params)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o.request_id for o in outs if o.finished] == [good]


@pytest.mark.parametrize("kwargs", [
    dict(max_tokens=0), dict(temperature=-0.5), dict(temperature=math.nan), dict(top_p=0.0),
    dict(top_p=1.5), dict(max_tokens=-3)])
def test_bad_sampling_params_raise(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_abort_frees_blocks(tiny_llama, reference):
    eng = make(tiny_llama)
    rid = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
    other = eng.add_request(PROMPTS[1], GREEDY)
    eng.step()
    eng.step()
    assert eng.block_manager.block_table(rid)
    eng.abort(rid)
    outs = eng.step()
    aborted = [o for o in outs if o.request_id == rid]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
    assert eng.block_manager.block_table(rid) == []
    final = {}
    while eng.has_unfinished():
        final.update({o.request_id: o for o in eng.step() if o.finished})
    assert eng.block_manager.num_used_blocks == 0
    # the other request ran on, unharmed by the abort beside it
    assert final[other].finish_reason == "length" and list(final[other].token_ids) == list(reference[1])


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    eng = make(tiny_llama)
    alone = eng.generate([PROMPTS[0]], params)[0].token_ids
    together = eng.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3]], params)[0].token_ids
    assert alone == together
    other_seed = eng.generate([PROMPTS[0]], SamplingParams(**{**_fields(params), "seed": 99}))[0].token_ids
    assert other_seed != alone


def _fields(p):
    return {k: getattr(p, k) for k in p.__slots__}


def test_max_num_seqs_caps_the_batch(tiny_llama):
    events = []
    eng = make(tiny_llama, max_num_seqs=2)
    eng.add_listener(events.append)
    eng.generate(PROMPTS, GREEDY)
    assert max(e.stats.num_running for e in events) == 2
    assert max(e.stats.num_waiting for e in events) >= 3


def test_generate_returns_input_order_and_stats(tiny_llama):
    eng = make(tiny_llama)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (9, 2, 5)]
    outs = eng.generate(PROMPTS[:3], params)
    assert [len(o.token_ids) for o in outs] == [9, 2, 5]
    st = eng.stats()
    assert st.num_requests == 3 and st.num_finished == 3
    assert st.num_generated_tokens == 16
    assert st.num_prompt_tokens == sum(len(p) for p in PROMPTS[:3])
    mem = eng.memory()
    assert mem.source == "budget" and mem.kv_blocks_total == 128 and mem.weights_bytes > 0


def test_logprobs_and_top_alternatives(tiny_llama):
    eng = make(tiny_llama)
    eng.add_request(PROMPTS[0], SamplingParams(max_tokens=4, temperature=0.0, logprobs=3))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    logprobs = [lp for o in outs for lp in o.logprobs]  # each output carries its new tokens' logprobs
    assert len(logprobs) == len(outs[-1].token_ids) == 4
    for tok, lp in zip(outs[-1].token_ids, logprobs):
        assert lp.token_id == tok and lp.logprob <= 0
        assert len(lp.top) == 3 and lp.top[0][0] == tok  # greedy: the sampled token is the best one
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


def test_stop_token_ids_and_max_tokens(tiny_llama, reference):
    eng = make(tiny_llama)
    stop_at = reference[0][5]
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=0.0,
                                                     stop_token_ids=[stop_at]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == stop_at and len(out.token_ids) == reference[0].index(stop_at) + 1


def test_reconfigure_applies_between_steps(tiny_llama):
    events = []
    eng = make(tiny_llama, max_num_seqs=4)
    eng.add_listener(events.append)
    for i, p in enumerate(PROMPTS + PROMPTS[:3]):  # finishing at different steps: seats free up one by one
        eng.add_request(p, SamplingParams(max_tokens=3 + 2 * i, temperature=0.0, ignore_eos=True))
    eng.step()
    assert events[-1].stats.num_running == 4
    eng.reconfigure(max_num_seqs=2, max_num_batched_tokens=64)
    with pytest.raises(ValueError):
        eng.reconfigure(block_size=8)
    with pytest.raises(ValueError):
        eng.reconfigure(policy="nonsense")
    seen = {rid for rid, _n, _kind in events[-1].stats.scheduled}
    admitted_at = []  # running after each step that admitted a request, from the change on
    while eng.has_unfinished():
        eng.step()
        new = {rid for rid, _n, _kind in events[-1].stats.scheduled} - seen
        seen |= new
        if new:
            admitted_at.append(events[-1].stats.num_running)
        assert max(n for _r, n, _k in events[-1].stats.scheduled) <= 64
    # running requests are not evicted by the change; every admission after it respects the new cap
    assert len(admitted_at) >= 2 and max(admitted_at) <= 2
    assert eng.config.max_num_seqs == 2 and len(seen) == 8


@pytest.mark.slow
def test_compiled_engine_gives_the_same_tokens(tiny_llama, reference):
    eng = make(tiny_llama, compile=True)
    assert eng.model.compiled
    assert [o.token_ids for o in eng.generate(PROMPTS[:2], GREEDY)] == reference[:2]
    # switched off and on between steps; a requantization swaps layers inside the compiled modules
    eng.reconfigure(compile=False)
    assert [o.token_ids for o in eng.generate(PROMPTS[2:4], GREEDY)] == reference[2:4]
    assert not eng.model.compiled
    eng.set_quantization("int8")
    eng.reconfigure(compile=True)
    int8 = eng.generate(PROMPTS[:2], GREEDY)
    assert eng.model.compiled and eng.config.quant_format == "int8"
    eng.reconfigure(compile=False)
    assert [o.token_ids for o in eng.generate(PROMPTS[:2], GREEDY)] == [o.token_ids for o in int8]


def test_reconfigure_switches_optional_scheduler_knobs_off(tiny_llama):
    """None is a value for max_step_ms and the latency budgets (off), not "keep what it was"."""
    eng = make(tiny_llama, max_step_ms=50, ttft_budget_ms=1000, tpot_budget_ms=100)
    eng.reconfigure(max_step_ms=None, ttft_budget_ms=None, max_num_seqs=3)
    eng.step()  # applied at the top of the next step
    assert (eng.config.max_step_ms, eng.config.ttft_budget_ms, eng.config.max_num_seqs) == (None, None, 3)
    assert eng.config.tpot_budget_ms == 100 and eng.scheduler.config is eng.config.scheduler


def test_latency_budgets_reorder_and_hold_prompts_but_keep_every_token(tiny_llama):
    """A tight TPOT budget holds prompt chunks back while the chats decode, a TTFT budget puts short prompts
    before a late document: the tokens are those of the plain scheduler, and every KV block comes back."""
    doc = [(7 * i) % 300 + 20 for i in range(200)]
    chats = [[250, 12, 33, 44], [9, 8, 7], [40 + i for i in range(30)]]
    plain = make(tiny_llama, num_kv_blocks=256)
    want = [o.token_ids for o in plain.generate([doc, *chats], GREEDY)]
    eng = make(tiny_llama, num_kv_blocks=256, max_num_batched_tokens=64, ttft_budget_ms=1.0, tpot_budget_ms=1.0)
    for prompt in PROMPTS:  # prompt steps and decode steps of several sizes teach both step-time lines
        eng.generate([prompt, *PROMPTS[:2]], GREEDY)
    assert eng.scheduler.step_time.line() is not None and eng.scheduler.decode_time.predict(2) is not None
    events = []
    eng.add_listener(events.append)
    ids = [eng.add_request(doc, GREEDY)]
    eng.step()  # the doc starts alone; by the next step it is late (1 ms of TTFT budget)
    ids += [eng.add_request(c, GREEDY) for c in chats]
    outs = {}
    while eng.has_unfinished():
        outs.update((o.request_id, o.token_ids) for o in eng.step() if o.finished)
    assert [outs[i] for i in ids] == want
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    firsts = [next(i for i, e in enumerate(events) if any(o.request_id == rid and o.token_ids for o in e.outputs))
              for rid in ids]
    assert max(firsts[1:]) < firsts[0]  # every chat had its first token before the late document


def test_max_step_ms_cuts_chunks_beside_decodes_and_keeps_the_tokens(tiny_llama_8_layers):
    from engine.core.step_time import MIN_CHUNK_TOKENS

    tiny = tiny_llama_8_layers  # 8 layers: a step of the 2-layer model took under 1 ms on a fast CPU (flaky)
    doc = [(7 * i) % 300 + 20 for i in range(200)]
    chat = [250, 12, 33, 44]
    plain = make(tiny, num_kv_blocks=256)
    want = [o.token_ids for o in plain.generate([chat, doc], GREEDY)]
    eng = make(tiny, num_kv_blocks=256, max_step_ms=1.0)  # below any step's time: the smallest chunks
    for prompt in PROMPTS:  # prompt steps of several sizes teach the step-time line
        eng.generate([prompt], GREEDY)
    assert eng.scheduler.step_time.line() is not None
    events = []
    eng.add_listener(events.append)
    ids = [eng.add_request(chat, GREEDY)]
    while not any(e.stats.num_decode_tokens for e in events):
        eng.step()
    ids.append(eng.add_request(doc, GREEDY))
    outs = {}
    while eng.has_unfinished():
        outs.update((o.request_id, o.token_ids) for o in eng.step() if o.finished)
    beside = [e.stats.num_prefill_tokens for e in events if e.stats.num_prefill_tokens and e.stats.num_decode_tokens]
    assert beside and max(beside) == MIN_CHUNK_TOKENS  # the doc went in small chunks while the chat decoded
    assert [outs[i] for i in ids] == want
