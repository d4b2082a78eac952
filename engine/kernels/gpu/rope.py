"""RoPE and the KV-cache write in one kernel: one program per (token, head) over the q/k/v projection's
output. A query head is rotated into q; a KV head's key is rotated and written, with its value, into the
paged cache at the token's slot (the cache head-major: (kv_heads, slots, head_dim)). Qwen3's per-head RMSNorm
of q and k runs first, in the same program.

Rounded as the torch layers round (engine/models/layers/rotary.py): "rotate half" is x * cos + roll(x) *
sin_signed, each product rounded to the activations' dtype, then their sum."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gpu.launches import launch
from engine.kernels.gpu.rounding import rounded as _round


@triton.jit
def _rope_and_cache(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                    qn_ptr, kn_ptr, stride_qkv, stride_cos, stride_qt, stride_qh, stride_ch, stride_cs, eps,
                    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    QK_NORM: tl.constexpr, HEAD_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    HALF: tl.constexpr = HEAD_DIM // 2
    dt = q_out_ptr.dtype.element_ty
    d = tl.arange(0, HEAD_PAD)  # head_dim need not be a power of two: masked to HEAD_DIM
    m = d < HEAD_DIM
    # "rotate half" on the whole head at once: each element's partner in the other half, and its sign
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    sign = tl.where(d < HALF, -1.0, 1.0)
    pos = tl.load(pos_ptr + t)
    cos = tl.load(cos_ptr + pos * stride_cos + d, mask=m, other=0.0).to(tl.float32)  # the halves repeat
    sin = tl.load(sin_ptr + pos * stride_cos + d, mask=m, other=0.0).to(tl.float32)
    src = qkv_ptr + t * stride_qkv + h * HEAD_DIM  # a query head, or (h >= NUM_HEADS) a key head
    x = tl.load(src + d, mask=m, other=0.0).to(tl.float32)
    xp = tl.load(src + partner, mask=m, other=0.0).to(tl.float32)
    if QK_NORM:  # RMSNorm over the head, rounded, times its weight, rounded
        is_q = h < NUM_HEADS
        w = tl.where(is_q, tl.load(qn_ptr + d, mask=m, other=0.0), tl.load(kn_ptr + d, mask=m, other=0.0))
        wp = tl.where(is_q, tl.load(qn_ptr + partner, mask=m, other=0.0),
                      tl.load(kn_ptr + partner, mask=m, other=0.0))
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
        x = _round(_round(x * inv, dt) * w.to(tl.float32), dt)
        xp = _round(_round(xp * inv, dt) * wp.to(tl.float32), dt)
    # x * cos + roll(x) * sin_signed, each product rounded, then the sum (negating is exact)
    out = _round(_round(x * cos, dt) + sign * _round(xp * sin, dt), dt)
    if h < NUM_HEADS:
        tl.store(q_out_ptr + t * stride_qt + h * stride_qh + d, out.to(dt), mask=m)
    else:
        kvh = h - NUM_HEADS
        slot = tl.load(slot_ptr + t)
        cache = kvh * stride_ch + slot * stride_cs
        tl.store(k_cache_ptr + cache + d, out.to(k_cache_ptr.dtype.element_ty), mask=m)
        v_src = qkv_ptr + t * stride_qkv + (NUM_HEADS + NUM_KV_HEADS + kvh) * HEAD_DIM
        tl.store(v_cache_ptr + cache + d, tl.load(v_src + d, mask=m), mask=m)


def rope_and_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
                   num_kv_heads: int, head_dim: int, q_norm: torch.Tensor | None = None,
                   k_norm: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """qkv (n, (heads + 2 kv_heads) * head_dim) -> q (n, heads, head_dim) rotated; k rotated and v written
    into k_cache / v_cache (kv_heads, slots, head_dim) at `slots` (n,). cos, sin: (positions, head_dim)
    tables (the halves repeat). q_norm / k_norm: (head_dim,) weights of a per-head RMSNorm, or None."""
    n = qkv.shape[0]
    q = torch.empty((n, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    qk_norm = q_norm is not None
    launch(_rope_and_cache, (n, num_heads + num_kv_heads), "rope_and_cache", qkv, positions, cos, sin, slots, q,
           k_cache, v_cache, q_norm if qk_norm else qkv, k_norm if qk_norm else qkv, qkv.stride(0), cos.stride(0),
           q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), eps, NUM_HEADS=num_heads,
           NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, QK_NORM=qk_norm,
           HEAD_PAD=triton.next_power_of_2(head_dim))
    return q
