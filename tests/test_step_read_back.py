"""A step reads its results back from the device once: the sampled tokens, and every verify row's
finiteness and argmax (greedy verification) in the same copy (ModelRunner._read_back). A verify of a
sampling request still reads its own decisions back once (engine/spec/verify.py, _verify_batched)."""
from __future__ import annotations

import torch

from engine import EngineConfig, LLMEngine, SamplingParams

PROMPTS = [[5, 17, 42, 99, 7, 250, 3, 64, 5, 17, 42, 99, 7, 250, 3, 64, 128, 11], [8, 9, 10, 8, 9, 10, 8, 9],
           list(range(20, 61))]


def test_sampling_and_every_greedy_verify_of_a_step_share_one_read_back(tiny_llama, monkeypatch):
    """Read-backs (tolist, item, a tensor's truth value) counted while the target runs and while its
    verifies are applied (the draft model's own proposing is not counted): one per step."""
    kw = dict(model=str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4, attention_backend="fast")
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=16, temperature=0.9, seed=1, ignore_eos=True)
    want = [list(o.token_ids) for o in LLMEngine(EngineConfig(**kw)).generate(PROMPTS, greedy)]
    eng = LLMEngine(EngineConfig(**kw, spec_method="draft", draft_quant_bits=8,
                                 num_speculative_tokens=3))  # a draft every step for every request
    copies: list[int] = []
    verifies: list[int] = []
    counting = [False]
    for name in ("tolist", "item", "__bool__"):
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

    def execute_and_note(sched, bm):
        copies.append(0)
        result = execute(sched, bm)
        verifies.append(len(result.verify_logits))
        return result

    monkeypatch.setattr(eng.runner, "execute", execute_and_note)
    monkeypatch.setattr(eng.spec, "apply_verify", counting_during(eng.spec.apply_verify))
    for i, prompt in enumerate(PROMPTS):
        eng.add_request(prompt, greedy, request_id=str(i))
    eng.add_request(PROMPTS[0], sampled, request_id="s")  # sampled in the same steps
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id] = list(o.token_ids)
    assert [outs[str(i)] for i in range(len(PROMPTS))] == want  # greedy speculation stays exact
    busy = [c for c, v in zip(copies, verifies) if v >= 2]
    assert busy and all(c == 1 for c in busy), list(zip(copies, verifies))
