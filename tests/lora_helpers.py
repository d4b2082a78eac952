"""PEFT adapters for the tests: random LoRA weights (B nonzero) on a tiny model, saved as PEFT folders,
and Hugging Face transformers + peft's greedy tokens as the reference."""
from __future__ import annotations

from pathlib import Path

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base: Path, out: Path, rank: int = 4, alpha: float = 8.0, targets=None, seed: int = 1,
                 rslora: bool = False, std: float = 0.3) -> Path:
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets or ALL_TARGETS, use_rslora=rslora,
                          init_lora_weights=False, lora_dropout=0.0)
    torch.manual_seed(seed)
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():  # large enough that the greedy path visibly changes
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.normal_(0, std)
    pm.save_pretrained(out)
    return out


def hf_greedy(base: Path, prompt: list[int], max_tokens: int, adapter: Path | None = None) -> list[int]:
    """Greedy continuation by transformers (+ peft running that adapter alone), float32."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]
