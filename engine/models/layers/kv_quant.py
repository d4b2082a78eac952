"""The 8-bit KV cache (EngineConfig.kv_cache_dtype="int8"): every (token, KV head) row of K or V is
stored as head_dim int8 values and its own float32 scale, the scale's 4 bytes inline at the end of
the row:

    cache (num_kv_heads, num_slots, head_dim + 4) int8      x ≈ q * scale,  scale = max|x| / 127

Inline scales keep a slot one row of one tensor, so everything that moves slots around (block copies,
tree moves, resizing, zeroing a failed request's slots) works on the int8 cache unchanged; a row of
zeros (scale 0) reads back as zeros. A row costs head_dim + 4 bytes instead of 2 * head_dim: at
head_dim 64 that is 0.53x, so the same memory holds 1.88x the blocks. Readers dequantize what they
gather (attention.py); the scale per row bounds the error by the row's own largest value.
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4  # one float32 per row


def kv_row_bytes(head_dim: int, dtype_bytes: int, quantized: bool) -> int:
    """Bytes of one (token, KV head) row of K or V."""
    return head_dim + SCALE_BYTES if quantized else head_dim * dtype_bytes


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def quantize_kv(x: torch.Tensor) -> torch.Tensor:
    """(..., head_dim) float -> (..., head_dim + 4) int8: the values, then the row's float32 scale."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True) / 127.0  # (..., 1)
    q = torch.where(scale > 0, xf / scale, torch.zeros_like(xf)).round_().clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)


def dequantize_kv(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(..., head_dim + 4) int8 -> (..., head_dim) in `dtype`; a 16-bit cache passes through."""
    if not is_quantized(cache):
        return cache
    d = cache.shape[-1] - SCALE_BYTES
    scale = cache[..., d:].contiguous().view(torch.float32)  # (..., 1)
    return (cache[..., :d].float() * scale).to(dtype)
