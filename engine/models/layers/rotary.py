"""Rotary position embeddings (RoPE), the "rotate half" layout of Hugging Face checkpoints.

Frequencies follow the config: plain, linear scaling, or Llama 3's frequency-dependent scaling.
A cos/sin table is built once for every position and indexed by each token's position.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (head_dim/2,) and the attention scaling factor for cos/sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq, 1.0
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        low_ff, high_ff = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low_ff, old_len / high_ff
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_mid, mid, scaled), 1.0
    raise ValueError(f"unsupported rope scaling {kind!r}; inferlab supports default, linear and llama3")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None):
        super().__init__()
        inv_freq, attn_factor = rope_inv_freq(head_dim, theta, scaling)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (max_positions, head_dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_positions, head_dim)
        self.register_buffer("cos", emb.cos() * attn_factor, persistent=False)
        self.register_buffer("sin", emb.sin() * attn_factor, persistent=False)
        # sin with the first half negated: "rotate half" becomes a roll (x2, x1) times it, the same products
        # as (-x2, x1) * sin (negating is exact), in one op instead of slices, a negation and a cat
        half = freqs.shape[-1]
        self.register_buffer("sin_signed", torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1),
                             persistent=False)

    def whole_tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of every position, (max_positions, head_dim) in `dtype`, made once per dtype: what the CUDA
        path's RoPE kernel reads by each token's position (rounded to the activations' dtype as `tables` rounds
        the rows it gathers)."""
        made = self.__dict__.setdefault("_whole", {})
        if dtype not in made:
            made[dtype] = (self.cos.to(dtype), self.sin.to(dtype))
        return made[dtype]

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_signed) of each token's position, (num_tokens, 1, head_dim) in `dtype`: gathered once a
        forward pass and shared by every layer (each layer gathered and cast its own: ~6 ops x 30 layers a
        step, which on a GPU are launches)."""
        return (self.cos[positions].to(dtype).unsqueeze(1), self.sin_signed[positions].to(dtype).unsqueeze(1))


def apply_rope(q: torch.Tensor, k: torch.Tensor,
               tables: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """q (num_tokens, heads, head_dim) and k (num_tokens, kv_heads, head_dim) rotated by `tables`."""
    cos, sin_signed = tables
    return _rotate(q, cos, sin_signed), _rotate(k, cos, sin_signed)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed
