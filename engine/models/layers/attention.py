"""Attention over a paged KV cache.

The KV cache of one layer is two head-major tensors of slots, (num_kv_heads, num_blocks * block_size,
head_dim): slot = block_id * block_size + offset. Head-major means a gather of slots lands directly in
the (heads, tokens, head_dim) layout attention multiplies, with no copy to rearrange it. New keys and
values are written at ``slot_mapping``; each sequence reads its context back through the slots listed
by its block table.

Which path computes it is one AttentionBackend, chosen once by engine/runner/attention_backend.py
(`select_backend`) and carried to every layer in the step's AttentionMetadata:
- ``reference``: one sequence at a time, walking its block table block by block, softmax written out.
  Slow and obvious; the tests hold every other path to it.
- otherwise ``paged_attention_fast``: prefill chunks (and verify runs) as two matmuls per query slice
  (with FlexAttention: chunks over a cached context in place); decode tokens by the first of these the
  backend has:
  - the C++ paged-decode kernel (engine/kernels, "native"): streams each sequence's K/V blocks
    once where they lie, all decodes in one call;
  - FlexAttention with a paged block mask (engine/models/layers/flex_paged.py; "flex", and "native" on
    CUDA): every decode in one call, each row reading its own pages in place;
  - the compiled gather-fused kernel (``decode_attention_math`` under torch.compile; "compiled", or any
    backend but reference with compile=True): the gather fused into the reductions, ~5x the eager path
    for 64 sequences of 800 tokens on the CPU;
  - the eager path: decodes batched by similar context length (a few matmuls per group; the GQA group
    dimension rides along, so K/V are never repeated).

The flat batch is ordered decodes first, then prefill chunks (the model runner guarantees it).

An 8-bit cache (engine/models/layers/kv_quant.py: int8 rows with an inline float32 scale) is written
quantized and dequantized as it is gathered; it runs the eager decode path (the native and compiled
decode kernels read 16-bit caches).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from engine.events import AttentionBackendName
from engine.models.layers.kv_quant import dequantize_kv, is_quantized, quantize_kv

QUERY_SLICE = 256  # prefill queries attended at once: bounds the scores, and skips most of the masked
# upper triangle (each slice multiplies only the keys up to its end): 1536 tokens prefill 30 % faster than 1024
# A chunk's keys are padded (masked, zero) to a multiple of this. The CPU kernels sum a row's products in
# blocks of the key dimension, with a tail of its own: the same query against 100 keys and against 300
# rounds differently, so a prompt's K/V would depend on where a chunk or a prefix-cache hit cut it. With
# every key count a multiple of 64, each query's nonzero terms fall in the same blocks whatever the cut
# (zeros add exactly nothing): a prompt leaves the same K/V however it was split.
KEY_ALIGN = 64


class CompiledDecode:
    """The compiled decode_attention_math for one engine. torch.compile builds it on the first call; where
    it cannot (no C++ compiler, an unsupported platform) the first failure disables it with one warning
    and the eager path serves from then on."""

    def __init__(self, fn) -> None:
        self.fn = fn  # torch.compile(decode_attention_math), or None once disabled
        self.ran = False  # it has run (the tests check no silent fallback happened)

    def __call__(self, qd, k_cache, v_cache, blocks, mask, block_size: int) -> torch.Tensor:
        out = self.fn(qd, k_cache, v_cache, blocks, mask, block_size)
        self.ran = True
        return out

    def disable(self, reason: str) -> None:
        warnings.warn(f"compiled decode attention unavailable, using the eager path: {reason}", stacklevel=3)
        self.fn = None


@dataclass(frozen=True, slots=True)
class AttentionBackend:
    """The attention path of every layer, chosen once (engine/runner/attention_backend.py)."""

    name: AttentionBackendName = AttentionBackendName.FAST  # as configured (EngineConfig.attention_backend)
    reference: bool = False  # the readable one-sequence-at-a-time path
    compiled_decode: CompiledDecode | None = None  # decode through the compiled gather-fused kernel
    native_decode: object = None  # the C++ paged-decode module, only where it applies to the model
    # what the eager paths' matmuls compute in when wider than the activations (fp32 on a CPU without
    # native bf16, engine/runner/cpu_compute.py): K/V widened as gathered, the output rounded back
    matmul_dtype: torch.dtype | None = None
    # FlexAttention with a paged block mask (engine/models/layers/flex_paged.py): decodes and prefill
    # chunks over a cached context read K/V in place
    flex: object = None
    # the CUDA path's Triton kernels (engine/kernels/gpu): add & norm, RoPE with the KV write, paged decode
    # and prefill attention, SwiGLU, sampling; None elsewhere (on the CPU only under Triton's interpreter)
    triton: object = None


EAGER = AttentionBackend()  # batched paged attention, no kernel: what a bare ModelRunner runs


@dataclass(slots=True)
class PrefillSeq:
    q_start: int  # first row of this chunk in the flat batch
    q_len: int  # tokens in this chunk
    ctx_len: int  # tokens of context after this chunk (cached + chunk)
    # (ceil(ctx_len / block_size),) the blocks holding the whole context; None when nothing was cached
    blocks: torch.Tensor | None
    # A verify run over a tree of drafts: (q_len, q_len) bool, row i sees chunk row j iff j is i or one of
    # its ancestors (instead of every earlier row). The context before the chunk is seen by every row.
    tree_mask: torch.Tensor | None = None
    flex_mask: object = None  # the FlexAttention block mask, built by the first layer of a step


@dataclass(slots=True)
class DecodeGroup:
    """Decode tokens of similar context length, attended together (padding stays small)."""

    start: int  # first row in the flat batch
    num_seqs: int
    max_ctx: int  # a whole number of blocks
    blocks: torch.Tensor  # (num_seqs * max_ctx / block_size,) each sequence's blocks, padded with block 0
    mask: torch.Tensor | None  # (num_seqs, 1, max_ctx) additive: 0 where attended, -inf on padding
    ctx_lens: torch.Tensor  # (num_seqs,) int64: each sequence's context (all the native kernel needs)
    flex_mask: object = None  # the FlexAttention block mask, built by the first layer of a step


@dataclass(slots=True)
class PrefillBatch:
    """The step's prompt chunks (those without a tree mask) for the Triton prefill kernel, each over its whole
    context in the paged cache."""

    tables: torch.Tensor  # (chunks, max_blocks) each chunk's sequence's blocks, padded with block 0
    q_starts: torch.Tensor  # (chunks,) first row of each chunk in the flat batch
    q_lens: torch.Tensor  # (chunks,)
    ctx_lens: torch.Tensor  # (chunks,) the context after the chunk (cached + chunk)
    max_q_len: int


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (num_tokens,) where each new token's K/V is written
    num_decode_tokens: int
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSeq] = field(default_factory=list)
    # For the reference path: (q_start, q_len, ctx_len, block_table) per sequence, in batch order.
    seqs: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    block_size: int = 16
    tree_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # q_start -> tree mask (see PrefillSeq)
    backend: AttentionBackend = EAGER  # the runner's (one object, not copies of its flags)
    prefill_batch: PrefillBatch | None = None  # the Triton backend's prompt chunks (tree verifies excluded)


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """(kv_heads, len(blocks) * block_size, head_dim): the listed blocks' slots, in order. Gathering whole
    blocks (rows of block_size * head_dim values) runs several times faster than gathering the same
    bytes slot by slot; this copy is most of a long-context decode step on the CPU."""
    kv_heads, _, head_dim = cache.shape
    rows = cache.view(kv_heads, -1, block_size * head_dim).index_select(1, blocks)
    return rows.view(kv_heads, -1, head_dim)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    # k, v: (num_tokens, num_kv_heads, head_dim) -> caches (num_kv_heads, num_slots, head_dim)
    if is_quantized(k_cache):  # rows of (num_kv_heads, num_slots, head_dim + 4) int8
        k, v = quantize_kv(k), quantize_kv(v)
    k_cache.index_copy_(1, slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, slot_mapping, v.transpose(0, 1))


def paged_attention_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: (num_tokens, num_heads, head_dim); k, v: this step's (num_tokens, num_kv_heads, head_dim).
    Returns (num_tokens, num_heads, head_dim). K/V must already be written to the cache."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[0]
    out = torch.empty_like(q)
    native, fused, flex = md.backend.native_decode, md.backend.compiled_decode, md.backend.flex
    wide = md.backend.matmul_dtype
    if is_quantized(k_cache):  # the kernels read 16-bit caches; this step's own K/V as the cache holds them
        native = fused = flex = None
        k, v = dequantize_kv(quantize_kv(k), q.dtype), dequantize_kv(quantize_kv(v), q.dtype)
    for g in md.decode_groups:
        n = g.num_seqs
        qg = q[g.start : g.start + n]
        if native is not None:  # K/V streamed from the cache by the C++ kernel, no copy
            qd = (qg.view(n, -1, group, head_dim) * scale).contiguous()  # (n, kv_heads, group, head_dim)
            o = native.paged_decode(qd, k_cache, v_cache, g.blocks.view(n, -1), g.ctx_lens,
                                              md.block_size)
            out[g.start : g.start + n] = o.view(n, num_heads, head_dim)
            continue
        if flex is not None and flex.fn is not None:  # K/V read in place, page by page, through the block mask
            try:
                out[g.start : g.start + n] = flex.decode(qg, k_cache, v_cache, g, md.block_size, scale)
                continue
            except Exception as exc:  # noqa: BLE001 (the compiler or the kernel failed): eager from now on
                flex.disable(f"{type(exc).__name__}: {exc}")
        if fused is not None and fused.fn is not None:
            qd = (qg.view(n, -1, group, head_dim) * scale).transpose(0, 1)  # (kv_heads, n, group, head_dim)
            try:
                o = fused(qd, k_cache, v_cache, g.blocks.view(n, -1), g.mask, md.block_size)
            except Exception as exc:  # the compiler failed (e.g. no C++ toolchain): eager from now on
                fused.disable(f"{type(exc).__name__}: {exc}")
            else:
                out[g.start : g.start + n] = o.transpose(0, 1).reshape(n, num_heads, head_dim)
                continue
        out[g.start : g.start + n] = _decode_attention(qg, k_cache, v_cache, g, group, scale, md.block_size, wide)
    for p in md.prefills:
        rows = slice(p.q_start, p.q_start + p.q_len)
        if flex is not None and flex.fn is not None and p.blocks is not None and p.tree_mask is None:
            try:  # over a cached context, in place
                out[rows] = flex.prefill(q[rows], k_cache, v_cache, p, md.block_size, scale)
                continue
            except Exception as exc:  # noqa: BLE001 (as for decodes)
                flex.disable(f"{type(exc).__name__}: {exc}")
        if p.blocks is None:  # nothing cached: this chunk is the whole context
            kp, vp = k[rows].transpose(0, 1), v[rows].transpose(0, 1)  # (kv_heads, q_len, head_dim)
        else:
            kp = dequantize_kv(gather_blocks(k_cache, p.blocks, md.block_size)[:, : p.ctx_len], q.dtype)
            vp = dequantize_kv(gather_blocks(v_cache, p.blocks, md.block_size)[:, : p.ctx_len], q.dtype)
        if wide is not None:  # widened once here, not per query slice
            kp, vp = kp.to(wide), vp.to(wide)
        if p.tree_mask is not None:  # a tree verify run: short, one slice, its own mask
            r = slice(p.q_start, p.q_start + p.q_len)
            out[r] = _chunk_attention(q[r], kp, vp, p, group, scale)
            continue
        for start in range(0, p.q_len, QUERY_SLICE):
            n = min(QUERY_SLICE, p.q_len - start)
            sub = PrefillSeq(p.q_start + start, n, p.ctx_len - p.q_len + start + n, None)
            r = slice(sub.q_start, sub.q_start + n)
            out[r] = _chunk_attention(q[r], kp[:, : sub.ctx_len], vp[:, : sub.ctx_len], sub, group, scale)
    return out


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, md: AttentionMetadata,
                           scale: float) -> torch.Tensor:
    """The Triton backend (the CUDA path): decodes by the paged decode kernel (one group: every row reads its
    own context to its own length), prompt chunks by the paged prefill kernel, both reading K/V in place;
    a tree verify (its own mask) by the matmul path over its gathered context. K/V must already be in the
    cache (the RoPE kernel writes them). q (num_tokens, heads, head_dim) -> the same shape."""
    kernels = md.backend.triton
    out = torch.empty_like(q)
    for g in md.decode_groups:
        rows = slice(g.start, g.start + g.num_seqs)
        kernels.paged_decode(q[rows], k_cache, v_cache, g.blocks.view(g.num_seqs, -1), g.ctx_lens, scale,
                             md.block_size, out=out[rows])
    b = md.prefill_batch
    if b is not None:
        kernels.paged_prefill(q, k_cache, v_cache, b.tables, b.q_starts, b.q_lens, b.ctx_lens, b.max_q_len, scale,
                              md.block_size, out)
    group = q.shape[1] // k_cache.shape[0]
    for p in md.prefills:
        if p.tree_mask is not None:
            rows = slice(p.q_start, p.q_start + p.q_len)
            kp = gather_blocks(k_cache, p.blocks, md.block_size)[:, : p.ctx_len]
            vp = gather_blocks(v_cache, p.blocks, md.block_size)[:, : p.ctx_len]
            out[rows] = _chunk_attention(q[rows], kp, vp, p, group, scale)
    return out


def _chunk_attention(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, p: PrefillSeq,
                     group: int, scale: float) -> torch.Tensor:
    """A prefill chunk (or a verify run): q (q_len, heads, head_dim) against its whole context
    kp, vp (kv_heads, ctx_len, head_dim), causal from the chunk's offset. Two matmuls with the query
    heads of a KV head stacked (K/V never repeated): on the CPU this beats SDPA's masked kernel by
    about 4x and its causal one too at these sizes. The caller cuts long chunks into QUERY_SLICE
    queries at a time, so the score matrix stays bounded. Computed in kp's dtype (the caller may have
    widened K/V), returned in q's."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = kp.shape[0]
    pad = -p.ctx_len % KEY_ALIGN  # see KEY_ALIGN: the padded keys are zero and masked
    keys = p.ctx_len + pad
    if pad:
        kp = torch.nn.functional.pad(kp, (0, 0, 0, pad))
        vp = torch.nn.functional.pad(vp, (0, 0, 0, pad))
    qg = (q.to(kp.dtype) * scale).transpose(0, 1).reshape(num_kv_heads, group * q_len, head_dim)
    scores = torch.matmul(qg, kp.transpose(-1, -2)).view(num_kv_heads, group, q_len, keys)
    seen = torch.zeros(q_len, keys, dtype=torch.bool, device=q.device)
    seen[:, : p.ctx_len] = chunk_mask(q_len, p.ctx_len, q.device, p.tree_mask)
    mask = torch.zeros(q_len, keys, dtype=kp.dtype, device=q.device).masked_fill_(~seen, float("-inf"))
    probs = (scores + mask).softmax(dim=-1).view(num_kv_heads, group * q_len, keys)
    out = torch.matmul(probs, vp)  # (kv_heads, group * q_len, head_dim)
    return out.view(num_heads, q_len, head_dim).transpose(0, 1).to(q.dtype)


def decode_attention_math(qd: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                          mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """Decode attention written as gathers, products and sums, for torch.compile: inductor fuses the
    block gather into the two reductions, so K and V are read once where they lie and never copied
    (the eager path copies every context into a padded batch first: for 64 sequences of 800 tokens
    this is ~5x faster on the CPU; for the small groups of a mixed workload ~1.5x).
    qd (kv_heads, n, group, head_dim), already scaled; blocks (n, max_blocks); mask (n, 1, max_ctx)
    additive. Scores and sums in float32. Returns (kv_heads, n, group, head_dim)."""
    kv_heads, n, _, head_dim = qd.shape
    k = k_cache.view(kv_heads, -1, block_size, head_dim)[:, blocks].reshape(kv_heads, n, -1, head_dim)
    scores = (qd.unsqueeze(-2).float() * k.unsqueeze(2).float()).sum(-1) + mask  # (kv_heads, n, group, ctx)
    probs = scores.softmax(-1)
    v = v_cache.view(kv_heads, -1, block_size, head_dim)[:, blocks].reshape(kv_heads, n, -1, head_dim)
    return (probs.unsqueeze(-1) * v.unsqueeze(2).float()).sum(-2).to(qd.dtype)


def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: DecodeGroup,
                      group: int, scale: float, block_size: int, wide: torch.dtype | None = None) -> torch.Tensor:
    """One query token per sequence (computed in `wide` when given, returned in q's dtype). The query heads
    sharing a KV head ride together as a (group,) dimension, so K/V are read once per KV head, never
    repeated. Plain matmuls beat SDPA's flash kernel here: with one query row per head there is nothing to
    tile, and the gather dominates anyway."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    # (kv_heads, n, group, head_dim); scale the few queries, not the many scores
    dtype = wide or q.dtype
    qd = (q.view(n, num_kv_heads, group, head_dim).to(dtype) * scale).transpose(0, 1)
    # index_select gathers rows far faster than advanced indexing on the CPU; the result is already
    # (kv_heads, n, max_ctx, head_dim), contiguous, so the matmuls run on it without a copy.
    shape = (num_kv_heads, n, g.max_ctx, head_dim)
    kd = dequantize_kv(gather_blocks(k_cache, g.blocks, block_size), dtype).to(dtype).view(shape)
    vd = dequantize_kv(gather_blocks(v_cache, g.blocks, block_size), dtype).to(dtype).view(shape)
    mask = g.mask
    if mask is None:  # a group made for a kernel that reads each context to its length (FlexAttention failed)
        valid = torch.arange(g.max_ctx, device=q.device).unsqueeze(0) < g.ctx_lens.to(q.device).unsqueeze(1)
        mask = torch.zeros(valid.shape, dtype=dtype, device=q.device).masked_fill_(~valid, float("-inf"))[:, None]
    scores = torch.matmul(qd, kd.transpose(-1, -2)) + mask  # (kv_heads, n, group, max_ctx)
    out = torch.matmul(scores.softmax(dim=-1), vd)  # (kv_heads, n, group, head_dim)
    return out.transpose(0, 1).reshape(n, num_heads, head_dim).to(q.dtype)


def chunk_mask(q_len: int, ctx_len: int, device: torch.device, tree_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(q_len, ctx_len) bool: which keys each query of a chunk sees. Query i sits at slot row
    ctx_len - q_len + i and sees every key before the chunk, then (causal) the chunk rows up to its own,
    or (tree) its ancestors and itself."""
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=device).unsqueeze(1)
    mask = torch.arange(ctx_len, device=device).unsqueeze(0) <= q_pos
    if tree_mask is not None:
        mask[:, ctx_len - q_len :] = tree_mask
    return mask


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              md: AttentionMetadata, scale: float) -> torch.Tensor:
    """The same result, one sequence at a time, reading K/V block by block through the block table."""
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[0]
    out = torch.empty_like(q)
    bs = md.block_size
    for q_start, q_len, ctx_len, block_table in md.seqs:
        keys, values = [], []
        for i, block in enumerate(block_table):
            n = min(bs, ctx_len - i * bs)
            if n <= 0:
                break
            # (n, kv_heads, head_dim), dequantized from an 8-bit cache
            keys.append(dequantize_kv(k_cache[:, block * bs : block * bs + n], q.dtype).transpose(0, 1))
            values.append(dequantize_kv(v_cache[:, block * bs : block * bs + n], q.dtype).transpose(0, 1))
        key = torch.cat(keys).float().repeat_interleave(group, dim=1)  # (ctx_len, heads, head_dim)
        value = torch.cat(values).float().repeat_interleave(group, dim=1)
        query = q[q_start : q_start + q_len].float()  # (q_len, heads, head_dim)
        scores = torch.einsum("qhd,khd->hqk", query, key) * scale  # (heads, q_len, ctx_len)
        scores = scores.masked_fill(~chunk_mask(q_len, ctx_len, q.device, md.tree_masks.get(q_start)), -math.inf)
        probs = scores.softmax(dim=-1)
        out[q_start : q_start + q_len] = torch.einsum("hqk,khd->qhd", probs, value).to(q.dtype)
    return out
