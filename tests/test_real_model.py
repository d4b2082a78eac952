"""On the real default model (SmolLM2-135M-Instruct): greedy tokens equal HF transformers' greedy tokens."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def engine():
    from engine import EngineConfig, LLMEngine

    return LLMEngine(EngineConfig(model="smollm2-135m", dtype="float32", kv_cache_memory_bytes=64 * 2**20))


def test_greedy_tokens_equal_transformers(engine):
    import transformers

    from engine import SamplingParams

    prompts = [
        engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]),
        "The three primary colors are",
        "def fibonacci(n):",
    ]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    ours = [o.token_ids for o in engine.generate(prompts, params)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32).eval()
    for prompt, got in zip(prompts, ours):
        ids = torch.tensor([engine.tokenizer.encode(prompt)])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        ref = ref[0, ids.shape[1]:].tolist()
        assert list(got) == ref, prompt  # both stop at the same end-of-turn token, or run to 24
    answer = engine.generate([prompts[0]], SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert "Paris" in answer.text
