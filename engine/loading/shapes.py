"""The shape every checkpoint tensor must have, as config.json implies it, checked against the weight files'
headers before any tensor is read or any layer built: a checkpoint that does not match its config fails
with one line naming the file, the tensor and both shapes (a mismatched copy_ could even broadcast
silently), and a config asking for more layers than the weights hold names the first one missing (one
asking for 100,000 over weights of 2 grew to 2.8 GB building them)."""
from __future__ import annotations

import re
from pathlib import Path

from safetensors import safe_open

from engine.loading.errors import ModelLoadError
from engine.models.model_config import ModelConfig

LAYER_NAME = re.compile(r"(?:model\.)?layers\.(\d+)\.")


def header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape as the file's header says it (no tensor is read); the header's own errors
    (not a safetensors file, cut short) pass through."""
    with safe_open(str(file), framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def check_weights(cfg: ModelConfig, headers: dict[Path, dict[str, tuple[int, ...]]], config_file: Path) -> None:
    """ModelLoadError unless every layer the config asks for is in the weights and every tensor has the
    shape the config implies; from the headers alone (header_shapes), before anything is allocated."""
    held = {int(m.group(1)) for shapes in headers.values() for name in shapes if (m := LAYER_NAME.match(name))}
    missing = next((i for i in range(cfg.num_hidden_layers) if i not in held), None)
    if missing is not None:
        raise ModelLoadError(f"{config_file}: num_hidden_layers is {cfg.num_hidden_layers:,} but the weights hold "
                             f"{len(held):,} layers (none numbered {missing}): weights and config from different "
                             "models?")
    expected = expected_shapes(cfg)
    for file, shapes in headers.items():
        check_shapes(shapes, expected, file)


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


def check_shapes(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], file: Path) -> None:
    """Raises ModelLoadError for the first tensor of `file` whose shape differs from the config's.
    Names the config does not know are left to the model's loader (which refuses what has no place)."""
    for name, shape in shapes.items():
        want = expected.get(name.removeprefix("model."))
        if want is not None and tuple(shape) != want:
            raise ModelLoadError(f"{file}: tensor {name!r} has shape {tuple(shape)} but config.json "
                                 f"implies {want} (weights and config from different models?)")
