"""A step reads its results back from the device once (engine/models/layers/read_back.py, to_host): the
sampled tokens, every verify row's finiteness, and every verify's decisions in the same copy, greedy (each
row's argmax) and sampling (acceptances and residual samples drawn on the device; engine/spec/verify.py
decide_on_device) alike."""
from __future__ import annotations

import torch

import engine.models.layers.read_back as read_back
from engine import EngineConfig, LLMEngine, SamplingParams

PROMPTS = [[5, 17, 42, 99, 7, 250, 3, 64, 5, 17, 42, 99, 7, 250, 3, 64, 128, 11], [8, 9, 10, 8, 9, 10, 8, 9],
           list(range(20, 61))]
READS = ("tolist", "item", "__bool__", "__float__", "__int__")  # each a wait for the device on a GPU


def test_sampling_and_every_verify_of_a_step_share_one_read_back(tiny_llama, monkeypatch):
    """Read-backs counted while the target runs and while its verifies are applied (the draft model's own
    proposing is not counted): one per step, with greedy and sampling verifies in the same step."""
    kw = dict(model=str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4, attention_backend="fast")
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=16, temperature=0.9, seed=1, ignore_eos=True, logprobs=2)
    want = [list(o.token_ids) for o in LLMEngine(EngineConfig(**kw)).generate(PROMPTS, greedy)]
    eng = LLMEngine(EngineConfig(**kw, spec_method="draft", draft_quant_format="int8",
                                 num_speculative_tokens=3))  # a draft every step for every request
    copies: list[int] = []
    kinds: list[set[bool]] = []  # per step: the greedy flags of the requests it verified
    counting = [False]
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original):
            if counting[0]:
                copies[-1] += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def counting_during(fn):
        def run(*args, **kwargs):
            counting[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                counting[0] = False
        return run

    execute = counting_during(eng.runner.execute)
    through_to_host: list[int] = []

    def execute_and_note(sched, bm):
        copies.append(0)
        before = read_back.count
        result = execute(sched, bm)
        through_to_host.append(read_back.count - before)
        kinds.append({result.order[i].request.sampling_params.greedy for i in result.verify_logits})
        return result

    monkeypatch.setattr(eng.runner, "execute", execute_and_note)
    monkeypatch.setattr(eng.spec, "apply_verify", counting_during(eng.spec.apply_verify))
    for i, prompt in enumerate(PROMPTS):
        eng.add_request(prompt, greedy, request_id=str(i))
    eng.add_request(PROMPTS[0], sampled, request_id="s")  # sampled, with logprobs, in the same steps
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id] = list(o.token_ids)
    assert [outs[str(i)] for i in range(len(PROMPTS))] == want  # greedy speculation stays exact
    assert len(outs["s"]) == 16
    mixed = [c for c, k in zip(copies, kinds) if k == {True, False}]  # greedy and sampling verifies together
    assert mixed and all(c == 1 for c in mixed), list(zip(copies, kinds))
    assert set(through_to_host) == {1}  # every step's one copy goes through to_host

