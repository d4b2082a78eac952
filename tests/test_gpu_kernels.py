"""The CUDA path's Triton kernels (engine/kernels/gpu), each against the torch layer it replaces: on the CPU
under Triton's interpreter (tests/triton_setup.py), on a GPU where torch sees one. The shapes of the default
model (SmolLM2-135M: hidden 576, 9 heads over 3 KV heads of 64, MLP 1536, vocabulary 49152 in the sampler's
greedy pass) and odd ones (head_dim 80, one KV head for 8 heads, MHA, lengths 1, at block edges and a full
table). bf16 results are held bit for bit where the torch layer rounds the same steps (norm, SwiGLU, RoPE and
the cache write); attention to float32's reference within rounding."""
from __future__ import annotations

import math

import pytest
import torch
from triton_setup import DEVICE, needs_triton

from engine.models.layers.attention import AttentionMetadata, paged_attention_reference
from engine.models.layers.linear import silu_and_mul
from engine.models.layers.norm import RMSNorm
from engine.models.layers.rotary import RotaryEmbedding, apply_rope
from engine.models.layers.sampler import shape_logits
from engine.sampling_params import SamplingParams

pytestmark = needs_triton


@pytest.fixture(scope="module")
def ops():
    from engine.kernels.gpu import load, unavailable

    assert unavailable(DEVICE) is None
    return load()


def _rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [576, 100])
def test_add_rms_norm_is_the_layers_add_and_norm(ops, dtype, hidden):
    torch.manual_seed(0)
    norm = RMSNorm(hidden, 1e-5).to(DEVICE, dtype)
    norm.weight.data = _rand(hidden, dtype=dtype)
    x, residual = _rand(5, hidden, dtype=dtype), _rand(5, hidden, dtype=dtype, scale=3.0)
    out, res = ops.add_rms_norm(x, norm.weight, 1e-5, residual)
    want, want_res = norm.forward_add(x, residual)
    assert torch.equal(res, want_res)  # the residual sum, rounded as torch rounds it
    # normalised in float32 (the layer sums squares in float64): bf16's rounding hides the difference
    assert torch.equal(out, want) if dtype == torch.bfloat16 else torch.allclose(out, want, rtol=1e-6, atol=1e-6)
    first, kept = ops.add_rms_norm(x, norm.weight, 1e-5)  # the first layer: no residual yet
    assert kept is x and torch.allclose(first.float(), norm(x).float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inter", [1536, 100])
def test_silu_and_mul_is_swiglu(ops, dtype, inter):
    torch.manual_seed(1)
    gate_up = _rand(3, 2 * inter, dtype=dtype, scale=2.0)
    got, want = ops.silu_and_mul(gate_up), silu_and_mul(gate_up)
    assert torch.equal(got, want) if dtype == torch.bfloat16 else torch.allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("heads,kv_heads,head_dim,qk_norm", [(9, 3, 64, False), (4, 2, 32, True), (6, 2, 80, False)])
def test_rope_and_cache_rotates_and_writes_each_slot(ops, heads, kv_heads, head_dim, qk_norm):
    torch.manual_seed(2)
    dtype, n, slots_total = torch.bfloat16, 3, 40
    rot = RotaryEmbedding(head_dim, 512, 10000.0, None).to(DEVICE)
    qkv = _rand(n, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    positions = torch.tensor([0, 17, 511], device=DEVICE)
    slots = torch.tensor([39, 0, 16], device=DEVICE)  # a block's first slot, the cache's first and last
    k_cache = torch.full((kv_heads, slots_total, head_dim), 7.0, dtype=dtype, device=DEVICE)
    v_cache = k_cache.clone()
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k, v = q.view(n, heads, head_dim), k.reshape(n, kv_heads, head_dim), v.reshape(n, kv_heads, head_dim)
    q_w = k_w = None
    if qk_norm:  # Qwen3: a per-head RMSNorm of q and k first
        qn, kn = RMSNorm(head_dim, 1e-6).to(DEVICE, dtype), RMSNorm(head_dim, 1e-6).to(DEVICE, dtype)
        qn.weight.data, kn.weight.data = _rand(head_dim, dtype=dtype), _rand(head_dim, dtype=dtype)
        q, k, q_w, k_w = qn(q), kn(k), qn.weight, kn.weight
    want_q, want_k = apply_rope(q, k, rot.tables(positions, dtype))
    cos, sin = rot.whole_tables(dtype)
    got_q = ops.rope_and_cache(qkv, positions, cos, sin, slots, k_cache, v_cache, heads, kv_heads, head_dim,
                               q_w, k_w, 1e-6)
    assert torch.equal(got_q, want_q)
    assert torch.equal(k_cache[:, slots].transpose(0, 1), want_k)
    assert torch.equal(v_cache[:, slots].transpose(0, 1), v)
    others = torch.ones(slots_total, dtype=torch.bool, device=DEVICE)
    others[slots] = False
    assert bool((k_cache[:, others] == 7.0).all() and (v_cache[:, others] == 7.0).all())  # nothing else written


def _paged_case(heads, kv_heads, head_dim, block_size, lens, dtype, width=None, seed=3):
    torch.manual_seed(seed)
    num_blocks = 64
    k_cache = _rand(kv_heads, num_blocks * block_size, head_dim, dtype=dtype)
    v_cache = _rand(kv_heads, num_blocks * block_size, head_dim, dtype=dtype)
    width = width or max(-(-n // block_size) for n in lens)
    tables = torch.stack([torch.randperm(num_blocks)[:width] for _ in lens]).to(DEVICE)  # blocks out of order
    return k_cache, v_cache, tables


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,lens,width,dtype", [
    (9, 3, 64, 16, [1, 16, 17, 40], None, torch.bfloat16),  # SmolLM2's heads; a length of 1, block edges
    (9, 3, 64, 16, [1, 16, 17, 40], None, torch.float32),
    (8, 1, 64, 16, [700, 3, 1024], None, torch.float32),  # 8 query heads a KV head; split context, a full table
    (4, 4, 32, 8, [5, 300], None, torch.float32),  # MHA, another block size
    (6, 2, 80, 16, [33, 90], None, torch.float32),  # head_dim 80 (masked to a power of two)
    (9, 3, 64, 16, [5, 9], 64, torch.float32),  # a graph's wide table: most splits hold no key
])
def test_paged_decode_reads_each_context_in_place(ops, heads, kv_heads, head_dim, block_size, lens, width, dtype):
    k_cache, v_cache, tables = _paged_case(heads, kv_heads, head_dim, block_size, lens, dtype, width)
    q = _rand(len(lens), heads, head_dim, dtype=dtype)
    seqs = [(i, 1, n, tables[i].tolist()) for i, n in enumerate(lens)]
    md = AttentionMetadata(slot_mapping=torch.zeros(len(lens), dtype=torch.long), num_decode_tokens=len(lens),
                           seqs=seqs, block_size=block_size)
    want = paged_attention_reference(q, k_cache, v_cache, md, head_dim**-0.5)
    got = ops.paged_decode(q, k_cache, v_cache, tables, torch.tensor(lens, device=DEVICE), head_dim**-0.5,
                           block_size)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)


def test_decode_splits_follow_the_tables_width_only(ops):
    assert ops.decode_splits(16) == (1, 64)
    splits, per = ops.decode_splits(8192)
    assert splits == 32 and per * splits >= 8192 and per % 64 == 0


@pytest.mark.parametrize("chunks,heads,kv_heads,head_dim,block_size,dtype", [
    ([(5, 5), (20, 50), (70, 70)], 9, 3, 64, 16, torch.float32),  # (chunk, context): fresh, over a cache, long
    ([(1, 1), (3, 100), (16, 32)], 4, 2, 32, 8, torch.float32),  # one token; a chunk ending on a block edge
    ([(5, 5), (20, 50)], 9, 3, 64, 16, torch.bfloat16),
])
def test_paged_prefill_is_causal_from_each_chunks_offset(ops, chunks, heads, kv_heads, head_dim, block_size, dtype):
    k_cache, v_cache, tables = _paged_case(heads, kv_heads, head_dim, block_size, [c for _, c in chunks], dtype)
    starts, start = [], 0
    for q_len, _ in chunks:
        starts.append(start)
        start += q_len
    q = _rand(start, heads, head_dim, dtype=dtype)
    seqs = [(s, q_len, ctx, tables[i].tolist()) for i, (s, (q_len, ctx)) in enumerate(zip(starts, chunks))]
    md = AttentionMetadata(slot_mapping=torch.zeros(start, dtype=torch.long), num_decode_tokens=0, seqs=seqs,
                           block_size=block_size)
    want = paged_attention_reference(q, k_cache, v_cache, md, head_dim**-0.5)
    got = torch.zeros_like(q)
    t = lambda xs: torch.tensor(xs, device=DEVICE)  # noqa: E731
    ops.paged_prefill(q, k_cache, v_cache, tables, t(starts), t([q for q, _ in chunks]), t([c for _, c in chunks]),
                      max(q for q, _ in chunks), head_dim**-0.5, block_size, got)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)


def _sample(ops, logits, temps, top_k=None, top_p=None, seeds=None):
    n = logits.shape[0]
    full = lambda v, dt: torch.full((n,), v, dtype=dt, device=DEVICE)  # noqa: E731
    temps = torch.tensor(temps, device=DEVICE, dtype=torch.float32) if isinstance(temps, list) else temps
    out = ops.sample(logits, temps, full(0, torch.int32) if top_k is None else top_k,
                     full(1.0, torch.float32) if top_p is None else top_p,
                     torch.arange(n, dtype=torch.int32, device=DEVICE) * 7919 if seeds is None else seeds)
    return out[:n].tolist(), out[n:].tolist()


def test_greedy_rows_take_torchs_argmax_and_nonfinite_rows_fail(ops):
    torch.manual_seed(4)
    logits = _rand(5, 49152, scale=3.0)  # SmolLM2's vocabulary: many chunks of the greedy pass
    logits[1, 5] = math.nan
    logits[2, 49151] = math.inf
    logits[3, 100] = logits[3, 40000] = logits[3].max() + 1  # a tie: the first index wins, as torch.argmax
    logits[4, 7] = -math.inf  # -inf alone is not finite either
    tokens, bad = _sample(ops, logits, [0.0] * 5)
    assert bad == [0, 1, 1, 0, 1]
    assert tokens[0] == int(logits[0].argmax()) and tokens[3] == 100


def test_sampling_draws_from_the_tempered_distribution(ops):
    row = torch.linspace(-2.0, 2.0, 6, device=DEVICE).unsqueeze(0)
    n = 200
    for temperature in (0.5, 2.0):  # distributions 0.5 apart in total variation
        tokens, bad = _sample(ops, row.expand(n, 6).contiguous(), [temperature] * n)
        counts = torch.bincount(torch.tensor(tokens), minlength=6).float() / n
        want = shape_logits(row.cpu(), [SamplingParams(temperature=temperature)]).softmax(-1)[0]
        # sampling noise alone: ~0.05 over 200 draws
        assert not any(bad) and 0.5 * (counts - want).abs().sum() < 0.12


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (4, 1.0), (0, 0.5), (6, 0.7), (0, 1e-6)])
def test_top_k_and_top_p_keep_the_torch_samplers_tokens(ops, top_k, top_p):
    torch.manual_seed(6)
    row = _rand(1, 40, scale=2.0)
    n = 12
    tokens, _ = _sample(ops, row.expand(n, 40).contiguous(), [1.0] * n,
                        torch.full((n,), top_k, dtype=torch.int32, device=DEVICE),
                        torch.full((n,), top_p, dtype=torch.float32, device=DEVICE))
    kept = shape_logits(row.cpu(), [SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)])[0] > -math.inf
    assert all(kept[t] for t in tokens)
    if int(kept.sum()) == 1:  # top-k 1 or a tiny top-p: the argmax, every time
        assert set(tokens) == {int(row.argmax())}
    else:
        assert len(set(tokens)) > 1  # a draw, not a fixed pick


def test_a_seed_draws_the_same_tokens_and_another_seed_others(ops):
    torch.manual_seed(7)
    logits = _rand(8, 64)
    seeds = torch.arange(8, dtype=torch.int32, device=DEVICE)
    first, _ = _sample(ops, logits, [1.0] * 8, seeds=seeds)
    assert _sample(ops, logits, [1.0] * 8, seeds=seeds)[0] == first
    assert _sample(ops, logits, [1.0] * 8, seeds=seeds + 1000)[0] != first
