"""Our forward pass equals Hugging Face transformers' on the same weights, and the fast attention path
equals the readable reference path."""
from __future__ import annotations

import pytest
import torch
import transformers

from engine import EngineConfig, LLMEngine

PROMPT = [5, 17, 42, 99, 7, 250, 3, 64, 128, 11, 300, 21, 8, 77, 91, 150, 33, 12, 200, 45]


def hf_logits(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def test_logits_equal_transformers(arch, request):
    folder = request.getfixturevalue(arch)
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=32))
    ours = eng.score(PROMPT)
    ref = hf_logits(folder, PROMPT)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen3"])
def test_decode_logits_equal_transformers(arch, request):
    """Token by token through the paged cache (prefill 7, then decodes) matches a full HF pass."""
    folder = request.getfixturevalue(arch)
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=32, block_size=4))
    from engine.sampling_params import SamplingParams

    eng.add_request(PROMPT[:7], SamplingParams(max_tokens=8, temperature=0.0, logprobs=0))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    generated = list(outs[-1].token_ids)
    ref = hf_logits(folder, PROMPT[:7] + generated)
    assert generated == ref[6:-1].argmax(-1).tolist()
    lps = [lp.logprob for o in outs for lp in o.logprobs]
    ref_lp = ref[6:-1].log_softmax(-1).gather(1, torch.tensor(generated)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(lps), ref_lp, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fast_backend", ["fast", "compiled"])
def test_fast_attention_equals_reference(tiny_llama, fast_backend):
    from engine.sampling_params import SamplingParams

    outs = {}
    for backend in (fast_backend, "reference"):
        eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4,
                                     attention_backend=backend, max_num_batched_tokens=9))
        params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=0)
        res = eng.generate([PROMPT, PROMPT[:5], PROMPT[3:15]], params)
        outs[backend] = [(o.token_ids, [lp.logprob for lp in o.logprobs or ()]) for o in res]
        outs[backend + "-score"] = eng.score(PROMPT)
        if backend == "compiled":  # it really ran compiled (no silent fallback to the eager path)
            compiled = eng.runner.backend.compiled_decode
            assert compiled is not None and compiled.fn is not None and compiled.ran
    fast = next(k for k in outs if k != "reference" and not k.endswith("-score"))
    for (ids_f, lp_f), (ids_r, lp_r) in zip(outs[fast], outs["reference"]):
        assert ids_f == ids_r
        torch.testing.assert_close(torch.tensor(lp_f), torch.tensor(lp_r), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outs[fast + "-score"], outs["reference-score"], atol=1e-4, rtol=1e-4)


def test_long_prompt_attends_in_query_slices(tiny_llama, monkeypatch):
    """A long prompt in one step runs its attention a slice of queries at a time; same logits as HF."""
    import random

    import engine.models.layers.attention as att

    rng = random.Random(0)
    ids = [rng.randrange(3, 300) for _ in range(250)]
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32))
    calls = []
    real = att._chunk_attention
    monkeypatch.setattr(att, "QUERY_SLICE", 64)
    monkeypatch.setattr(att, "_chunk_attention", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    ours = eng.score(ids)
    assert calls == [64, 64, 64, 58] * eng.model_config.num_hidden_layers
    torch.testing.assert_close(ours, hf_logits(tiny_llama, ids), atol=1e-4, rtol=1e-4)
