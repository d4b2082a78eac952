"""Attention over a paged KV cache.

The KV cache of one layer is two flat tensors of slots, (num_blocks * block_size, num_kv_heads,
head_dim): slot = block_id * block_size + offset. New keys/values are written at ``slot_mapping``;
each sequence reads its context back through the slots listed by its block table.

Two paths compute the same thing:
- ``reference``: one sequence at a time, walking its block table block by block, softmax written out.
  Slow and obvious; the tests hold the fast path to it.
- ``fast``: all decode tokens of the step in one batched SDPA call (the GQA group dimension rides in
  the query-length slot, so K/V are never repeated), prefill chunks one SDPA call each.

The flat batch is ordered decodes first, then prefill chunks (the model runner guarantees it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillSeq:
    q_start: int  # first row of this chunk in the flat batch
    q_len: int  # tokens in this chunk
    ctx_len: int  # tokens of context after this chunk (cached + chunk)
    slots: torch.Tensor | None  # (ctx_len,) slots of the whole context; None when nothing was cached


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (num_tokens,) where each new token's K/V is written
    num_decode_tokens: int
    decode_slots: torch.Tensor | None  # (num_decodes, max_ctx) context slots, padded with 0
    decode_mask: torch.Tensor | None  # (num_decodes, 1, 1, max_ctx) True where a key is attended
    prefills: list[PrefillSeq] = field(default_factory=list)
    # For the reference path: (q_start, q_len, ctx_len, block_table) per sequence, in batch order.
    seqs: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    block_size: int = 16


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    # k, v: (num_tokens, num_kv_heads, head_dim) -> caches (num_slots, num_kv_heads, head_dim)
    k_cache.index_copy_(0, slot_mapping, k)
    v_cache.index_copy_(0, slot_mapping, v)


def paged_attention_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: (num_tokens, num_heads, head_dim); k, v: this step's (num_tokens, num_kv_heads, head_dim).
    Returns (num_tokens, num_heads, head_dim). K/V must already be written to the cache."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    nd = md.num_decode_tokens
    if nd:
        # (nd, kv_heads, group, head_dim): the group of query heads sharing a KV head acts as the
        # "query length" of SDPA, so one call covers GQA without repeating K/V.
        qd = q[:nd].view(nd, num_kv_heads, group, head_dim)
        kd = k_cache[md.decode_slots].transpose(1, 2)  # (nd, kv_heads, max_ctx, head_dim)
        vd = v_cache[md.decode_slots].transpose(1, 2)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=md.decode_mask, scale=scale)
        out[:nd] = od.reshape(nd, num_heads, head_dim)
    for p in md.prefills:
        qp = q[p.q_start : p.q_start + p.q_len].transpose(0, 1)  # (heads, q_len, head_dim)
        if p.slots is None:  # nothing cached: this chunk is the whole context
            kp = k[p.q_start : p.q_start + p.q_len].transpose(0, 1)
            vp = v[p.q_start : p.q_start + p.q_len].transpose(0, 1)
            mask, causal = None, True
        else:
            kp = k_cache[p.slots].transpose(0, 1)  # (kv_heads, ctx_len, head_dim)
            vp = v_cache[p.slots].transpose(0, 1)
            mask, causal = _offset_causal_mask(p.q_len, p.ctx_len, q.device), False
        if group > 1:
            kp = kp.repeat_interleave(group, dim=0)
            vp = vp.repeat_interleave(group, dim=0)
        op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=causal, scale=scale)
        out[p.q_start : p.q_start + p.q_len] = op.transpose(0, 1)
    return out


def _offset_causal_mask(q_len: int, ctx_len: int, device: torch.device) -> torch.Tensor:
    # Query i sits at position ctx_len - q_len + i and sees keys 0..that position.
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=device).unsqueeze(1)
    return torch.arange(ctx_len, device=device).unsqueeze(0) <= q_pos  # (q_len, ctx_len)


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              md: AttentionMetadata, scale: float) -> torch.Tensor:
    """The same result, one sequence at a time, reading K/V block by block through the block table."""
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[1]
    out = torch.empty_like(q)
    bs = md.block_size
    for q_start, q_len, ctx_len, block_table in md.seqs:
        keys, values = [], []
        for i, block in enumerate(block_table):
            n = min(bs, ctx_len - i * bs)
            if n <= 0:
                break
            keys.append(k_cache[block * bs : block * bs + n])
            values.append(v_cache[block * bs : block * bs + n])
        key = torch.cat(keys).float().repeat_interleave(group, dim=1)  # (ctx_len, heads, head_dim)
        value = torch.cat(values).float().repeat_interleave(group, dim=1)
        query = q[q_start : q_start + q_len].float()  # (q_len, heads, head_dim)
        scores = torch.einsum("qhd,khd->hqk", query, key) * scale  # (heads, q_len, ctx_len)
        scores = scores.masked_fill(~_offset_causal_mask(q_len, ctx_len, q.device), -math.inf)
        probs = scores.softmax(dim=-1)
        out[q_start : q_start + q_len] = torch.einsum("hqk,khd->qhd", probs, value).to(q.dtype)
    return out
