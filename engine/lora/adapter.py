"""PEFT LoRA adapters: read `adapter_config.json` + `adapter_model.safetensors` and check them against the
base model, so an adapter made for another base is refused before it reaches a device slot.

A LoRA adapter adds a low-rank update to chosen projections:  y = W x + s * B (A x),  A (r, in), B (out, r),
with s = lora_alpha / r (or lora_alpha / sqrt(r) with rsLoRA, `use_rslora`). The scale is folded into B
here once, so the batched update (engine/lora/layer.py) is two plain products per row.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine import files
from engine.lora.checks import LoraLoadError, check_config, check_pair, check_values
from engine.models.model_config import ModelConfig

__all__ = ["LoraAdapter", "LoraLoadError", "load_adapter", "read_config", "scaling", "target_shapes"]

# PEFT target name -> (our module under the decoder layer, which slice of its output). q/k/v and gate/up
# are fused in our model (engine/models/llama.py), so an update to q_proj lands in the first rows of qkv_proj.
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("self_attn.qkv_proj", 0), "k_proj": ("self_attn.qkv_proj", 1), "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}
MAX_ADAPTER_CONFIG_BYTES = 2**20  # adapter_config.json: a few hundred bytes
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# Config features that change the math beyond y = Wx + s B A x: refused rather than silently ignored.
_UNSUPPORTED = {"use_dora": "DoRA", "modules_to_save": "modules_to_save", "layer_replication": "layer_replication",
                "trainable_token_indices": "trainable tokens"}


@dataclass(slots=True)
class LoraAdapter:
    """One adapter's weights on the host: per (layer, target) its A (r, in) and its scaled B (out, r)."""

    name: str
    path: str
    lora_id: int  # unique per add_lora, never reused: part of each KV block's prefix hash
    rank: int  # the largest rank among its modules
    alpha: float
    rslora: bool
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for t in TARGETS if any(k[1] == t for k in self.weights))

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def target_shapes(mc: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every LoRA target of this base model."""
    q, kv = mc.num_attention_heads * mc.head_dim, mc.num_key_value_heads * mc.head_dim
    h, i = mc.hidden_size, mc.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def scaling(alpha: float, rank: int, rslora: bool) -> float:
    """PEFT's scale: alpha / r, or alpha / sqrt(r) with rank-stabilized LoRA (rsLoRA)."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def _pattern_value(patterns: dict, module_key: str, default):
    """PEFT's rank_pattern / alpha_pattern: a key matches a module whose name ends with it."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?{pattern}$", module_key):
            return value
    return default


def read_config(folder: Path) -> dict:
    cfg_path = folder / "adapter_config.json"
    if not cfg_path.exists():
        raise LoraLoadError(f"{folder} holds no adapter_config.json (a PEFT LoRA adapter folder has one)")
    try:  # a regular file, bounded in size and depth (engine/files.py)
        cfg = files.read_json(cfg_path, MAX_ADAPTER_CONFIG_BYTES)
    except (OSError, ValueError) as exc:
        raise LoraLoadError(f"cannot read {cfg_path}: {getattr(exc, 'why', exc)}") from None
    check_config(cfg)  # a JSON object with sane numbers and patterns, before anything reads a field
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise LoraLoadError(f"{folder} is a {cfg.get('peft_type')} adapter; only LoRA adapters are supported")
    used = [what for key, what in _UNSUPPORTED.items() if cfg.get(key)]
    if cfg.get("bias", "none") != "none":
        used.append(f"bias={cfg['bias']!r}")
    if used:
        raise LoraLoadError(f"{folder}: adapter uses {', '.join(used)}, which inferlab does not support")
    return cfg


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    st = folder / "adapter_model.safetensors"
    if not st.exists():
        raise LoraLoadError(f"{folder} holds no adapter_model.safetensors")
    try:
        files.check_regular(st)  # (safetensors would wait for ever on a FIFO)
        return load_file(str(st))
    except Exception as exc:  # noqa: BLE001 (a corrupt file: say which, whatever safetensors raised)
        raise LoraLoadError(f"cannot read {st}: {exc}") from None


def load_adapter(path: str | Path, name: str, lora_id: int, mc: ModelConfig, max_rank: int,
                 dtype: torch.dtype) -> LoraAdapter:
    """Read and check a PEFT adapter folder against the base model `mc`. Raises LoraLoadError with every
    mismatch (unknown modules, layers the base lacks, wrong shapes, a rank above max_rank) in one message."""
    folder = Path(path)
    cfg = read_config(folder)
    tensors = _read_tensors(folder)
    shapes = target_shapes(mc)
    alpha, rslora, alpha_pattern = check_config(cfg)
    problems: list[str] = []
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None or m.group(3) not in TARGETS:
            problems.append(f"{key}: not a LoRA weight of a q/k/v/o/gate/up/down projection")
            continue
        layer, target = int(m.group(1)), m.group(3)
        if layer >= mc.num_hidden_layers:
            problems.append(f"{key}: layer {layer}, but the base model has {mc.num_hidden_layers} layers")
            continue
        pairs.setdefault((layer, target), {})[m.group(4)] = t
    weights = {}
    for (layer, target), ab in sorted(pairs.items()):
        where = f"layers.{layer}.{target}"
        if set(ab) != {"A", "B"}:
            problems.append(f"{where}: has lora_{''.join(ab)} without its partner")
            continue
        a, b = ab["A"], ab["B"]
        problem = check_pair(a, b, *shapes[target], max_rank)
        if problem is not None:
            problems.append(f"{where}: {problem}")
            continue
        r = a.shape[0]
        key = f"model.layers.{layer}.{TARGETS[target][0].split('.')[0]}.{target}"
        scaled_b = (b.double() * scaling(float(_pattern_value(alpha_pattern, key, alpha)), r, rslora)).to(dtype)
        problem = check_values({"lora_B x lora_alpha / r": scaled_b})
        if problem is not None:
            problems.append(f"{where}: {problem}")
            continue
        weights[(layer, target)] = (a.to(dtype).contiguous(), scaled_b.contiguous())
    if not weights and not problems:
        problems.append("no LoRA weights found")
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise LoraLoadError(f"adapter {name!r} at {folder} does not fit this base model ({mc.model_type}, "
                            f"hidden {mc.hidden_size}, {mc.num_hidden_layers} layers): "
                            + "; ".join(problems[:4]) + more)
    rank = max(a.shape[0] for a, _ in weights.values())
    return LoraAdapter(name, str(folder), lora_id, rank, alpha, rslora, weights)
