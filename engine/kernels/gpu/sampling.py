"""Sampling a batch in one kernel: one program a row of logits, writing the token and a failure flag into one
integer tensor (tokens, then flags), so the step reads its results back in one copy.

Per row: a pass over the vocabulary finds the maximum, its first index (greedy's token: torch.argmax's) and
whether any logit is NaN or infinite (then the row fails: its request fails alone, engine/models/layers/
sampler.py). A sampling row (temperature > 0) then works on z = (logit - max) / temperature, as the torch
sampler does:
- top-k: the threshold is the k-th largest z, found by bisection (each step counts the z above a value), not
  by sorting the vocabulary;
- top-p, over the top-k survivors renormalised: the smallest threshold whose strictly-higher mass is below
  top_p of theirs, by bisection on the mass;
- the token: the Gumbel-max trick, argmax of z + Gumbel noise over the survivors, which draws from their
  softmax. The noise is Philox (tl.rand) keyed by a per-row seed the caller derives from the request's seed
  and its token count: a seeded request draws the same tokens every run on this path (not the torch
  sampler's: another generator).
Ties at a threshold keep every tied token (a sort keeps an arbitrary k of them)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gpu.launches import launch

BLOCK = 1024
SEARCH_STEPS = 32  # bisection steps: the threshold to 2^-32 of the row's range


@triton.jit
def _count_mass(row_ptr, n_cols, row_max, inv_temp, lo, above, BLOCK: tl.constexpr):
    """(how many z >= lo, the mass exp(z) of z > above) over a row (z as in the module doc)."""
    count = 0
    mass = 0.0
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        z = (tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32) - row_max) * inv_temp
        count += tl.sum((z >= lo).to(tl.int32), axis=0)
        mass += tl.sum(tl.where((z > above) & (z >= lo), tl.exp(z), 0.0), axis=0)
    return count, mass


@triton.jit
def _sample(logits_ptr, stride, n_cols, n_rows, temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, out_ptr,
            BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    best = float("-inf")
    best_at = 0
    lowest = float("inf")
    bad = 0
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        valid = cols < n_cols
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        finite = (x == x) & (tl.abs(x) < float("inf"))
        bad = tl.maximum(bad, tl.max((valid & ~finite).to(tl.int32), axis=0))
        chunk_best = tl.max(x, axis=0)
        chunk_at = c0 + tl.argmax(x, axis=0)
        better = chunk_best > best  # strictly: the first index of the maximum wins, as torch.argmax
        best_at = tl.where(better, chunk_at, best_at)
        best = tl.maximum(best, chunk_best)
        lowest = tl.minimum(lowest, tl.min(tl.where(valid, x, float("inf")), axis=0))
    temp = tl.load(temp_ptr + row)
    if (temp > 0.0) & (bad == 0):
        inv_temp = 1.0 / temp
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        floor = (lowest - best) * inv_temp  # the least z: every token survives a threshold at it
        lo_k = floor
        if (top_k > 0) & (top_k < n_cols):  # the largest threshold that keeps at least top_k tokens
            lo = floor
            hi = 0.0
            for _ in range(SEARCH_STEPS):
                mid = 0.5 * (lo + hi)
                count, _m = _count_mass(base, n_cols, best, inv_temp, mid, 1.0, BLOCK)
                lo = tl.where(count >= top_k, mid, lo)
                hi = tl.where(count >= top_k, hi, mid)
            lo_k = lo
        keep_from = lo_k
        if top_p < 1.0:  # the least threshold whose strictly-higher mass is below top_p of the survivors'
            _c, kept_mass = _count_mass(base, n_cols, best, inv_temp, lo_k, float("-inf"), BLOCK)
            target = top_p * kept_mass
            _c, at_lo = _count_mass(base, n_cols, best, inv_temp, lo_k, lo_k, BLOCK)
            if at_lo >= target:
                lo = lo_k
                hi = 0.0  # nothing lies strictly above the maximum: mass 0 < target
                for _ in range(SEARCH_STEPS):
                    mid = 0.5 * (lo + hi)
                    _c, above = _count_mass(base, n_cols, best, inv_temp, lo_k, mid, BLOCK)
                    hi = tl.where(above < target, mid, hi)
                    lo = tl.where(above < target, lo, mid)
                keep_from = hi
        seed = tl.load(seed_ptr + row)
        draw = float("-inf")
        for c0 in range(0, n_cols, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            z = (tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32) - best) * inv_temp
            u = tl.rand(seed, cols)
            gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-20)))
            scored = tl.where((z >= keep_from) & (cols < n_cols), z + gumbel, float("-inf"))
            chunk_best = tl.max(scored, axis=0)
            chunk_at = c0 + tl.argmax(scored, axis=0)
            best_at = tl.where(chunk_best > draw, chunk_at, best_at)
            draw = tl.maximum(draw, chunk_best)
    tl.store(out_ptr + row, best_at.to(tl.int64))
    tl.store(out_ptr + n_rows + row, bad.to(tl.int64))


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seeds: torch.Tensor) -> torch.Tensor:
    """logits (n, vocab); temperature (n,) float32, 0 for greedy rows; top_k (n,) int32 (0: off); top_p (n,)
    float32 (1: off); seeds (n,) int32 (sampling rows' noise). Returns (2n,) int64: each row's token, then
    1 where the row's logits were not all finite (its token is then meaningless)."""
    n, vocab = logits.shape
    out = torch.empty(2 * n, dtype=torch.int64, device=logits.device)
    launch(_sample, (n,), "sample", logits, logits.stride(0), vocab, n, temperature, top_k, top_p, seeds, out,
           BLOCK=BLOCK, SEARCH_STEPS=SEARCH_STEPS)
    return out
