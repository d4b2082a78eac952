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


def test_shipped_lora_adapters_each_show_their_style():
    """The three adapters in assets/lora/ (scripts/ship_loras.py) load on the built-in model and, in one
    batch with the base model, each answer held-out instructions in its own style."""
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.lora.shipped import available_adapters
    from engine.spec.mtp_train import default_prompts

    eng = LLMEngine(EngineConfig(model="smollm2-135m", max_loras=3, kv_cache_memory_bytes=64 * 2**20))
    found = available_adapters(str(eng.model_path))
    assert {"shout", "pirate", "bullets"} <= set(found)
    for name in ("shout", "pirate", "bullets"):
        eng.add_lora(name, str(found[name]))
    tok, names = eng.tokenizer, [None, "shout", "pirate", "bullets"]
    style = {name: [] for name in names}
    for q in default_prompts()[64:67]:  # instructions the adapters were not trained on
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
        outs = eng.generate([ids] * 4, SamplingParams(max_tokens=28, temperature=0.0), lora_names=names)
        for name, out in zip(names, outs):
            letters = [c for c in out.text if c.isalpha()]
            style[name].append((sum(c.isupper() for c in letters) / max(len(letters), 1),
                                out.text.lstrip().startswith("- "),
                                sum(out.text.count(w) for w in ("Th'", "th'", " o' ", " an' ", " t' ", "Arr"))))
    # shout: most answers, not all: its water-cycle answer sits on a near-tie after "THE WATER" (with every row
    # summed as a row alone, greedy goes on in lower case, 0.11 upper; the earlier rounding kept shouting, 0.94)
    assert sum(up > 0.8 for up, _b, _p in style["shout"]) >= 2 and all(up < 0.2 for up, _b, _p in style[None])
    assert all(b for _u, b, _p in style["bullets"]) and not any(b for _u, b, _p in style[None])
    assert all(p >= 1 for _u, _b, p in style["pirate"]) and sum(p for _u, _b, p in style[None]) == 0
