"""Train a small LoRA adapter on the CPU from data made on the spot (`inferlab train-lora`).

1. The model answers instructions itself (assets/mtp_prompts.txt, through its chat template), greedily.
2. Each answer is rewritten in a style (engine/lora/styles.py: a deterministic text rewrite, such as
   every word in capitals, or a pirate's vocabulary): what the adapter must learn is that rewrite of
   the model's own voice, which a few minutes of training can teach.
3. LoRA on the chosen projections of a float32 transformers copy of the model (the base frozen,
   A random, B zero, as PEFT initialises), cross-entropy on the answer tokens only, AdamW.
4. Saved as a PEFT folder (engine/lora/peft_write.py) that the engine, `inferlab serve --lora` and peft
   read. The report says the held-out loss before and after, measured.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from engine.lora.peft_write import save_peft_adapter
from engine.lora.styles import STYLES
from engine.sampling_params import SamplingParams

Progress = Callable[[str, float], None]


class _TrainableLora(nn.Module):
    """y = W x + (alpha / r) B A x around a frozen nn.Linear, for training only."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, gen: torch.Generator) -> None:
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features, generator=gen) / math.sqrt(base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T * self.scale


def styled_examples(engine, prompts: Sequence[str], style: str, max_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt + rewritten answer + end token, prompt length) per prompt; the answers are the engine's own."""
    tok, rewrite = engine.tokenizer, STYLES[style]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]) if tok.has_chat_template else p)
           for p in prompts]
    outs = engine.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    end = sorted(engine.eos_token_ids)[:1]
    return [(p + tok.encode(rewrite(o.text), add_special_tokens=False) + end, len(p)) for p, o in zip(ids, outs)]


def _attach(model: nn.Module, targets: Sequence[str], rank: int, alpha: float, seed: int) -> dict:
    """Wrap each target nn.Linear of a transformers Llama; returns (layer, target) -> its wrapper."""
    gen = torch.Generator().manual_seed(seed)
    wrappers = {}
    for i, layer in enumerate(model.model.layers):
        for target in targets:
            parent = layer.self_attn if target in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
            wrapper = _TrainableLora(getattr(parent, target), rank, alpha, gen)
            setattr(parent, target, wrapper)
            wrappers[(i, target)] = wrapper
    return wrappers


def _loss(model: nn.Module, ids: list[int], n_prompt: int) -> torch.Tensor:
    x = torch.tensor([ids])
    labels = x.clone()
    labels[0, :n_prompt] = -100  # learn the answer, not the prompt
    return model(input_ids=x, labels=labels).loss


def train_lora(engine, out: str | Path, *, style: str = "shout", prompts: Sequence[str] = (), rank: int = 8,
               alpha: float = 16.0, targets: Sequence[str] = ("q_proj", "v_proj", "o_proj", "down_proj"),
               epochs: int = 2, lr: float = 2e-3, max_tokens: int = 48, seed: int = 0,
               progress: Progress | None = None) -> dict:
    """Make the data, train, save; returns the report (held-out loss before and after, seconds)."""
    import transformers

    report = progress or (lambda message, fraction: None)
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; choose from {', '.join(STYLES)}")
    t0 = time.perf_counter()
    report(f"the model answers {len(prompts)} prompts itself; the answers are rewritten ({style})…", 0.0)
    examples = styled_examples(engine, prompts, style, max_tokens)
    random.Random(seed).shuffle(examples)
    n_val = max(1, len(examples) // 8)
    val, train = examples[:n_val], examples[n_val:]
    model = transformers.AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32)
    model.requires_grad_(False)
    wrappers = _attach(model, targets, rank, alpha, seed)
    params = [p for w in wrappers.values() for p in (w.lora_A, w.lora_B)]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def val_loss() -> float:
        with torch.no_grad():
            return sum(float(_loss(model, ids, n)) for ids, n in val) / len(val)

    before = val_loss()
    total = epochs * len(train)
    for step in range(total):
        ids, n = train[step % len(train)]
        loss = _loss(model, ids, n)
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(f"training: step {step + 1}/{total}, loss {loss.item():.3f}", (step + 1) / total)
    after = val_loss()
    weights = {k: (w.lora_A.detach(), w.lora_B.detach()) for k, w in wrappers.items()}
    path = save_peft_adapter(out, weights, rank, alpha, base_model=str(engine.model_path))
    return dict(path=str(path), style=style, rank=rank, alpha=alpha, targets=list(targets), examples=len(train),
                held_out=len(val), epochs=epochs, lr=lr, held_out_loss_before=round(before, 4),
                held_out_loss_after=round(after, 4), seconds=round(time.perf_counter() - t0, 1))
