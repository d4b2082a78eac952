"""The shape every checkpoint tensor must have, as config.json implies it, checked file by file while
loading: a checkpoint that does not match its config fails with one line naming the file, the tensor
and both shapes, before any weight is copied (a mismatched copy_ could even broadcast silently)."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.loading.errors import ModelLoadError
from engine.models.model_config import ModelConfig


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name (without the leading "model.") -> shape."""
    hidden, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (cfg.vocab_size, hidden), "norm.weight": (hidden,),
        "lm_head.weight": (cfg.vocab_size, hidden),
    }
    per_layer = {
        "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_out, hidden), "self_attn.k_proj.weight": (kv_out, hidden),
        "self_attn.v_proj.weight": (kv_out, hidden), "self_attn.o_proj.weight": (hidden, q_out),
        "self_attn.q_proj.bias": (q_out,), "self_attn.k_proj.bias": (kv_out,), "self_attn.v_proj.bias": (kv_out,),
        "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    for layer in range(cfg.num_hidden_layers):
        shapes.update({f"layers.{layer}.{name}": shape for name, shape in per_layer.items()})
    return shapes


def check_shapes(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], file: Path) -> None:
    """Raises ModelLoadError for the first tensor of `file` whose shape differs from the config's.
    Names the config does not know are left to the model's loader (which refuses what has no place)."""
    for name, tensor in tensors.items():
        want = expected.get(name.removeprefix("model."))
        if want is not None and tuple(tensor.shape) != want:
            raise ModelLoadError(f"{file}: tensor {name!r} has shape {tuple(tensor.shape)} but config.json "
                                 f"implies {want} (weights and config from different models?)")
