"""What an adapter must be before the engine takes it: a config that is a JSON object with numbers where
numbers belong, patterns that are valid regular expressions, 2-D floating-point weights of rank >= 1 whose
values (and scale) are finite and of a sane size, and a name a client can type.

An adapter that lies (NaN or 1e30 weights, `lora_alpha: Infinity`, a rank-0 tensor) must be refused when it
is loaded, with the reason: once in a device slot it would turn every one of its requests' logits into NaN.
"""
from __future__ import annotations

import math
import numbers
import re

import torch

# LoRA weights are small (PEFT initialises A ~ 1/sqrt(in), trained values stay well below 1): anything
# beyond these is a broken or hostile file, and its products would overflow 16-bit activations.
MAX_ABS_WEIGHT = 1e4
MAX_ABS_ALPHA = 1e6
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}")  # 1 to 64 characters a client can type


class LoraLoadError(ValueError):
    """An adapter that cannot be used with this base model (one message saying every reason)."""


def check_name(name: object) -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ValueError(f"a LoRA adapter name is 1 to 64 characters (letters, digits, '_', '.', ':', '/', '-'; "
                         f"a letter or digit first), got {name!r:.80}")
    return name


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or abs(float(value)) > MAX_ABS_ALPHA:
        raise LoraLoadError(f"{what} must be a finite number of magnitude <= {MAX_ABS_ALPHA:g}, got {value!r:.40}")
    return float(value)


def _patterns(cfg: dict, key: str) -> dict[str, float]:
    """PEFT's rank_pattern / alpha_pattern: a mapping of module-name patterns (regular expressions) to numbers."""
    patterns = cfg.get(key) or {}
    if not isinstance(patterns, dict):
        raise LoraLoadError(f"{key} must be a mapping of module patterns to numbers, got {type(patterns).__name__}")
    for pattern, value in patterns.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise LoraLoadError(f"{key}: {pattern!r:.40} is not a valid pattern ({exc})") from None
        _number(value, f"{key}[{pattern!r:.40}]")
    return patterns


def check_config(cfg: object) -> tuple[float, bool, dict[str, float]]:
    """(lora_alpha, use_rslora, alpha_pattern) of an adapter_config.json, or LoraLoadError."""
    if not isinstance(cfg, dict):
        raise LoraLoadError(f"adapter_config.json must hold a JSON object, got a {type(cfg).__name__}")
    rank = cfg.get("r", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraLoadError(f"r must be an integer >= 1, got {rank!r:.40}")
    alpha = _number(cfg.get("lora_alpha", rank), "lora_alpha")
    rslora = cfg.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise LoraLoadError(f"use_rslora must be true or false, got {rslora!r:.40}")
    _patterns(cfg, "rank_pattern")
    return alpha, rslora, _patterns(cfg, "alpha_pattern")


def check_pair(a: torch.Tensor, b: torch.Tensor, fan_in: int, fan_out: int, max_rank: int) -> str | None:
    """Why lora_A (r, in) and lora_B (out, r) cannot be used here, or None."""
    if not (a.is_floating_point() and b.is_floating_point()):
        return f"lora_A {a.dtype} and lora_B {b.dtype}: LoRA weights are floating-point"
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] < 1 or a.shape[1] != fan_in or b.shape != (fan_out, a.shape[0]):
        return (f"lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, but this base needs lora_A (r, {fan_in}) "
                f"and lora_B ({fan_out}, r) with r >= 1")
    if a.shape[0] > max_rank:
        return f"rank {a.shape[0]} exceeds max_lora_rank={max_rank}"
    return check_values({"lora_A": a, "lora_B": b})


def check_values(tensors: dict[str, torch.Tensor]) -> str | None:
    """Why these weights cannot be used (not finite, or absurdly large), or None."""
    for what, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            return f"{what} holds values that are not finite (NaN or infinite)"
        largest = float(t.abs().max()) if t.numel() else 0.0
        if largest > MAX_ABS_WEIGHT:
            return f"{what} holds a value of magnitude {largest:.3g} (LoRA weights stay below {MAX_ABS_WEIGHT:g})"
    return None
