"""Paged attention over the head-major cache (kv_heads, num_blocks * block_size, head_dim), K/V read in place
through each sequence's block table (slot = block * block_size + offset): never gathered into a copy.

`paged_decode`: one query token per sequence. A program takes one (sequence, KV head, split): the query heads
of that KV head ride together as the rows of one product (GQA: K/V read once for the group), and a long
context is cut into splits that run side by side, each with its own running max and sum (online softmax),
merged by a second kernel. Lengths and block tables are tensors the kernel reads, and the split count
follows the table's width, not the lengths: a CUDA graph captured once serves every context length up to it.

`paged_prefill`: the prompt chunks of a step (already written to the cache), BLOCK_M queries of one head a
program, causal from each chunk's offset in its sequence (query i of a chunk of q_len over a context of
ctx_len sits at position ctx_len - q_len + i and sees keys up to it).

Scores, softmax and sums in float32. Triton 3.6's interpreter multiplies bf16 operands of tl.dot wrongly
(numpy has no bf16): under it (the CPU tests) the operands are widened to float32 first; on a GPU they go to
the tensor cores as they are."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gpu import interpreting
from engine.kernels.gpu.launches import launch
from engine.kernels.gpu.rounding import rounded

TILE = 64  # keys a loop iteration reads (whole blocks of any power-of-two size up to it, or parts of one)
SPLIT_MIN_TOKENS = 256  # a split's least share of the longest context a table can hold
MAX_SPLITS = 32
NEG_INF = float("-inf")


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr):
    """a @ b in float32: widened first under the interpreter (see the module doc); on a GPU 16-bit operands go
    to the tensor cores as they are and float32 ones are multiplied in full precision (not TF32: a float32
    engine must give the CPU's tokens)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _online_update(s, m_i, l_i, acc, v, DOT_F32: tl.constexpr):
    """One tile of scores s (rows, TILE) -> the running max, sum and weighted values, with a row whose
    every score so far is -inf kept at zero weight (not NaN)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    pv = _dot(rounded(p, v.dtype).to(v.dtype), v, DOT_F32)  # rounded as the GPU rounds (rounding.py)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _attend_tile(q, k_ptr, v_ptr, table_ptr, cache, stride_cs, t, tm, seen, d, dm, m_i, l_i, acc,
                 BLOCK_SIZE: tl.constexpr, DOT_F32: tl.constexpr):
    """The keys and values at positions t (valid where tm) of one sequence (its block table at table_ptr), read
    in place, into the running softmax of the queries q; `seen` (rows, keys) says which query sees which key."""
    block = tl.load(table_ptr + t // BLOCK_SIZE, mask=tm, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + t % BLOCK_SIZE
    kv_mask = tm[:, None] & dm[None, :]
    k = tl.load(k_ptr + cache + slot[:, None] * stride_cs + d[None, :], mask=kv_mask, other=0.0)
    s = tl.where(seen, _dot(q, tl.trans(k), DOT_F32), float("-inf"))
    v = tl.load(v_ptr + cache + slot[:, None] * stride_cs + d[None, :], mask=kv_mask, other=0.0)
    return _online_update(s, m_i, l_i, acc, v, DOT_F32)


@triton.jit
def _paged_decode(q_ptr, k_ptr, v_ptr, table_ptr, len_ptr, out_ptr, part_ptr, ml_ptr, split_tokens, scale,
                  stride_qt, stride_qh, stride_ch, stride_cs, stride_tb, stride_ot, stride_oh,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
                  DOT_F32: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(len_ptr + b)
    start = split * split_tokens
    end = tl.minimum(ctx, start + split_tokens)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    gm = g < GROUP
    dm = d < HEAD_DIM
    heads = kvh * GROUP + g
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    if start < end:  # a split past the context (most of a graph's wide table) only says so below
        q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :],
                    other=0.0)
        q = rounded(q.to(tl.float32) * scale, q.dtype).to(q.dtype)
        cache = kvh * stride_ch
        for t0 in range(start, end, TILE):
            t = t0 + tl.arange(0, TILE)
            tm = t < end
            m_i, l_i, acc = _attend_tile(q, k_ptr, v_ptr, table_ptr + b * stride_tb, cache, stride_cs, t, tm,
                                         tm[None, :], d, dm, m_i, l_i, acc, BLOCK_SIZE, DOT_F32)
    if NUM_SPLITS == 1:  # the whole context in this program: the result itself
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 rounded(o, out_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=gm[:, None] & dm[None, :])
    else:  # this split's share: its max, sum and unnormalised sum of values, merged by _merge_splits
        row = (b * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split  # (seq, head, split)
        tl.store(part_ptr + row[:, None] * HEAD_PAD + d[None, :], acc, mask=gm[:, None])
        tl.store(ml_ptr + row * 2, m_i, mask=gm)
        tl.store(ml_ptr + row * 2 + 1, l_i, mask=gm)


@triton.jit
def _merge_splits(part_ptr, ml_ptr, out_ptr, stride_ot, stride_oh, NUM_SPLITS: tl.constexpr,
                  HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    row = (b * tl.num_programs(1) + h) * NUM_SPLITS + tl.arange(0, NUM_SPLITS)
    m = tl.load(ml_ptr + row * 2)
    l = tl.load(ml_ptr + row * 2 + 1)  # noqa: E741
    m_all = tl.max(m, axis=0)  # finite: the first split always holds a key
    w = tl.where(l > 0.0, tl.exp(m - m_all), 0.0)
    d = tl.arange(0, HEAD_PAD)
    parts = tl.load(part_ptr + row[:, None] * HEAD_PAD + d[None, :])
    o = tl.sum(parts * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + b * stride_ot + h * stride_oh + d, rounded(o, dt).to(dt), mask=d < HEAD_DIM)


def decode_splits(max_tokens: int) -> tuple[int, int]:
    """(splits, tokens a split) for tables of max_tokens slots: a power of two of splits, each at least
    SPLIT_MIN_TOKENS long and a whole number of TILEs (the count depends on the table's width only)."""
    splits = 1
    while splits < MAX_SPLITS and max_tokens > splits * SPLIT_MIN_TOKENS:
        splits *= 2
    per = triton.cdiv(triton.cdiv(max_tokens, splits), TILE) * TILE
    return splits, per


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                 ctx_lens: torch.Tensor, scale: float, block_size: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """q (n, heads, head_dim); tables (n, max_blocks) block ids; ctx_lens (n,) >= 1 each (this step's K/V
    already written). Returns (n, heads, head_dim) in q's dtype."""
    n, heads, head_dim = q.shape
    kv_heads = k_cache.shape[0]
    group = heads // kv_heads
    splits, per = decode_splits(tables.shape[1] * block_size)
    out = torch.empty_like(q) if out is None else out
    head_pad = triton.next_power_of_2(head_dim)
    part = ml = out
    if splits > 1:
        part = torch.empty((n * heads * splits, head_pad), dtype=torch.float32, device=q.device)
        ml = torch.empty((n * heads * splits, 2), dtype=torch.float32, device=q.device)
    launch(_paged_decode, (n, kv_heads, splits), "paged_decode", q, k_cache, v_cache, tables, ctx_lens, out,
           part, ml, per, scale, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), tables.stride(0),
           out.stride(0), out.stride(1), GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
           HEAD_DIM=head_dim, HEAD_PAD=head_pad, BLOCK_SIZE=block_size, TILE=TILE, NUM_SPLITS=splits,
           DOT_F32=interpreting())
    if splits > 1:
        launch(_merge_splits, (n, heads), "merge_splits", part, ml, out, out.stride(0), out.stride(1),
               NUM_SPLITS=splits, HEAD_DIM=head_dim, HEAD_PAD=head_pad)
    return out


@triton.jit
def _paged_prefill(q_ptr, k_ptr, v_ptr, table_ptr, qstart_ptr, qlen_ptr, ctx_ptr, out_ptr, scale,
                   stride_qt, stride_qh, stride_ch, stride_cs, stride_tb, stride_ot, stride_oh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr):
    mb = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    q_len = tl.load(qlen_ptr + seq)
    if mb * BLOCK_M < q_len:
        q_start = tl.load(qstart_ptr + seq)
        ctx = tl.load(ctx_ptr + seq)
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rm = rows < q_len
        qpos = ctx - q_len + rows  # each query's position in its sequence
        d = tl.arange(0, HEAD_PAD)
        dm = d < HEAD_DIM
        q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_qt + h * stride_qh + d[None, :],
                    mask=rm[:, None] & dm[None, :], other=0.0)
        q = rounded(q.to(tl.float32) * scale, q.dtype).to(q.dtype)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
        cache = (h // GROUP) * stride_ch
        hi = tl.minimum(ctx, ctx - q_len + (mb + 1) * BLOCK_M)  # keys past the block's last query are unseen
        for t0 in range(0, hi, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            tm = t < hi
            seen = (t[None, :] <= qpos[:, None]) & tm[None, :]  # causal from the chunk's offset
            m_i, l_i, acc = _attend_tile(q, k_ptr, v_ptr, table_ptr + seq * stride_tb, cache, stride_cs, t, tm,
                                         seen, d, dm, m_i, l_i, acc, BLOCK_SIZE, DOT_F32)
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + (q_start + rows)[:, None] * stride_ot + h * stride_oh + d[None, :],
                 rounded(o, out_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=rm[:, None] & dm[None, :])


PREFILL_BLOCK_M = 64
PREFILL_BLOCK_N = 64


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                  q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, max_q_len: int,
                  scale: float, block_size: int, out: torch.Tensor) -> torch.Tensor:
    """Prompt chunks of the flat batch q (num_tokens, heads, head_dim) into out's same rows: chunk i is rows
    q_starts[i] .. + q_lens[i], over a context of ctx_lens[i] tokens (the chunk included, already in the
    cache) listed by tables[i] (chunks, max_blocks)."""
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k_cache.shape[0]
    grid = (triton.cdiv(max_q_len, PREFILL_BLOCK_M), heads, q_lens.shape[0])
    launch(_paged_prefill, grid, "paged_prefill", q, k_cache, v_cache, tables, q_starts, q_lens, ctx_lens, out,
           scale, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), tables.stride(0), out.stride(0),
           out.stride(1), GROUP=group, HEAD_DIM=head_dim, HEAD_PAD=triton.next_power_of_2(head_dim),
           BLOCK_SIZE=block_size, BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N, DOT_F32=interpreting())
    return out
