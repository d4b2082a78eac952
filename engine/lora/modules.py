"""The model side of multi-LoRA: swap every LoRA-able projection of the model for a LoraLinear around it,
load an adapter's weights into a device slot of all of them, and tell them which rows of each forward
pass belong to which slot."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from engine.lora.adapter import TARGETS, LoraAdapter, target_shapes
from engine.lora.layer import LoraLinear, LoraRows, lora_dtype
from engine.models.model_config import ModelConfig

# our module under a decoder layer -> its PEFT parts in output order (see TARGETS)
_MODULE_PARTS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
                 "mlp.gate_up_proj": ("gate_proj", "up_proj"), "mlp.down_proj": ("down_proj",)}


def pool_bytes(mc: ModelConfig, max_loras: int, max_rank: int, device: torch.device, dtype: torch.dtype) -> int:
    """Device bytes of the preallocated slots: max_loras x max_rank x (in + out) per target and layer."""
    elem = torch.empty((), dtype=lora_dtype(device, dtype)).element_size()
    per_layer = sum(fan_in + fan_out for fan_in, fan_out in target_shapes(mc).values())
    return max_loras * max_rank * per_layer * mc.num_hidden_layers * elem


class LoraModules:
    """Owns the LoraLinear wrappers of one model (installed by the constructor, a module swap)."""

    def __init__(self, model: nn.Module, mc: ModelConfig, max_loras: int, max_rank: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.rows = LoraRows()
        self.device = device
        shapes = target_shapes(mc)
        self.wrappers: dict[tuple[int, str], LoraLinear] = {}  # (layer, our module name) -> wrapper
        for i, layer in enumerate(model.layers):
            for module_name, parts in _MODULE_PARTS.items():
                parent_name, _, child = module_name.rpartition(".")
                parent = layer.get_submodule(parent_name)
                outs = tuple(shapes[p][1] for p in parts)
                wrapper = LoraLinear(getattr(parent, child), shapes[parts[0]][0], outs, max_loras, max_rank,
                                     self.rows, device, dtype)
                setattr(parent, child, wrapper)
                self.wrappers[(i, module_name)] = wrapper

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes() for w in self.wrappers.values())

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Put the adapter's weights in `slot` of every wrapper (those it does not update get none)."""
        by_module: dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for (layer, target), (a, b) in adapter.weights.items():
            module_name, part = TARGETS[target]
            by_module.setdefault((layer, module_name), {})[part] = (a.to(self.device), b.to(self.device))
        for key, wrapper in self.wrappers.items():
            if key in by_module:
                wrapper.load(slot, by_module[key])
            else:
                wrapper.clear(slot)

    def clear(self, slot: int) -> None:
        for wrapper in self.wrappers.values():
            wrapper.clear(slot)

    def bind(self, rows_of: Sequence[tuple[int, int]], slot_of: Callable[[int], int]) -> None:
        """Before a forward pass: `rows_of` is (lora_id, num_rows) per request in batch order (lora_id 0:
        the base model). Rows of one slot become one group: a slice when they are contiguous."""
        spans: dict[int, list[tuple[int, int]]] = {}
        offset = 0
        for lora_id, n in rows_of:
            if lora_id:
                runs = spans.setdefault(slot_of(lora_id), [])
                if runs and runs[-1][1] == offset:
                    runs[-1] = (runs[-1][0], offset + n)
                else:
                    runs.append((offset, offset + n))
            offset += n
        segments = []
        for slot, runs in spans.items():
            if len(runs) == 1:
                segments.append((slot, slice(*runs[0])))
            else:
                idx = torch.cat([torch.arange(a, b) for a, b in runs]).to(self.device)
                segments.append((slot, idx))
        self.rows.segments = segments
