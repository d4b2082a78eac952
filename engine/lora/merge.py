"""Merge one adapter into the base weights (W += s B A): the single-adapter baseline with no per-row
update at all, the thing batched serving gives up to run many adapters in one batch."""
from __future__ import annotations

import torch
from torch import nn

from engine.lora.adapter import TARGETS, LoraAdapter, target_shapes
from engine.models.layers.linear import Linear
from engine.models.model_config import ModelConfig

_PARTS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


@torch.no_grad()
def merge_adapter(model: nn.Module, mc: ModelConfig, adapter: LoraAdapter) -> None:
    """Add each target's s B A into the rows of its (fused) 16-bit Linear, and refresh packed copies."""
    shapes = target_shapes(mc)
    touched = set()
    for (layer, target), (a, b_scaled) in adapter.weights.items():
        module_name, part = TARGETS[target]
        module = model.layers[layer].get_submodule(module_name)
        if not isinstance(module, Linear):
            raise ValueError(f"cannot merge into {type(module).__name__} (16-bit Linear weights only)")
        siblings = _PARTS.get(module_name, (target,))
        start = sum(shapes[t][1] for t in siblings[:part])
        w = module.weight
        w[start : start + shapes[target][1]] += (b_scaled.float() @ a.float()).to(w.device, w.dtype)
        touched.add(module)
    for module in touched:
        if module.packed is not None:
            module.pack()
