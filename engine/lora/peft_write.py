"""Write LoRA weights as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors), the
format engine/lora/adapter.py reads and `peft.PeftModel.from_pretrained` loads: for adapters that
inferlab makes itself (`inferlab train-lora`, the LoRA bench) without peft installed."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.lora.adapter import TARGETS, target_shapes
from engine.models.model_config import ModelConfig


def save_peft_adapter(folder: str | Path, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
                      rank: int, alpha: float, base_model: str = "", rslora: bool = False) -> Path:
    """`weights`: (layer, PEFT target name) -> (A (r, in), B (out, r)), B unscaled as PEFT stores it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for (layer, target), (a, b) in weights.items():
        prefix = f"base_model.model.model.layers.{layer}.{TARGETS[target][0].split('.')[0]}.{target}"
        tensors[f"{prefix}.lora_A.weight"] = a.detach().float().contiguous().cpu()
        tensors[f"{prefix}.lora_B.weight"] = b.detach().float().contiguous().cpu()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    targets = sorted({t for _, t in weights})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": targets, "use_rslora": rslora, "lora_dropout": 0.0, "bias": "none",
              "base_model_name_or_path": base_model, "fan_in_fan_out": False, "inference_mode": True}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


def random_adapter(mc: ModelConfig, rank: int, targets: tuple[str, ...], seed: int,
                   std: float = 0.02) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """Random A and B (B nonzero, unlike a fresh PEFT init) for every layer and target: adapters for
    benchmarks, where the cost matters and not what they say."""
    gen = torch.Generator().manual_seed(seed)
    shapes = target_shapes(mc)
    out = {}
    for layer in range(mc.num_hidden_layers):
        for t in targets:
            fan_in, fan_out = shapes[t]
            out[(layer, t)] = (torch.randn(rank, fan_in, generator=gen) * std,
                               torch.randn(fan_out, rank, generator=gen) * std)
    return out
