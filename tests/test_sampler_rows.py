"""The sampler reads one number a row for its finiteness check and takes a CPU row's argmax in chunks
(issue 46, point 4): the same tokens, logprobs and failures as the straightforward sampler (every logit
checked, torch's argmax, one draw a row), for any mix of greedy and seeded rows; sampled rows draw from the
tempered, cut distribution."""
from __future__ import annotations

import functools
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import kernel_module
from engine.models.layers.sampler import ARGMAX_CHUNK, row_argmax, sample, shape_logits
from engine.sampling_params import SamplingParams


def plain_sample(logits, params, seeds):
    """The sampler written plainly: isfinite over every logit, argmax, a sampled row's token by the inverse of
    its cumulative distribution at one uniform number from its seed."""
    bad = ~torch.isfinite(logits).all(dim=-1)
    chosen = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        sub = logits[rows]
        sub.masked_fill_(bad[rows].unsqueeze(1), 0.0)
        probs = shape_logits(sub, [params[i] for i in rows]).softmax(dim=-1)
        for j, i in enumerate(rows):  # the first token whose cumulative mass passes u of the total (u: its seed's)
            u = torch.rand((), dtype=torch.float64, generator=torch.Generator().manual_seed(seeds[i]))
            mass = probs[j].double().cumsum(0)
            chosen[i] = int((mass > u * mass[-1]).nonzero()[0, 0])
    return [None if b else int(t) for t, b in zip(chosen, bad)], [i for i in range(len(params)) if bad[i]]



@functools.cache
def native_modules() -> tuple:
    """The native module, where a compiler builds it (else none: torch's path alone is checked)."""
    return tuple(m for m in [kernel_module()] if m is not None)


# the vocabulary sizes that matter: below two chunks (torch's argmax), whole chunks, a short last chunk
vocabs = st.sampled_from([7, 2 * ARGMAX_CHUNK - 1, 2 * ARGMAX_CHUNK, 3 * ARGMAX_CHUNK + 5, 49152])
edits = st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1), st.sampled_from([math.nan, math.inf, -math.inf, 0.0,
                                                                                 -0.0, 1e30, -1e30])), max_size=6)


def logits_of(n: int, vocab: int, seed: int, rounded: bool, changes) -> torch.Tensor:
    x = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed))
    if rounded:  # ties: argmax must take the first
        x = x.round()
    for row, where, value in changes:
        x[row % n, int(where * (vocab - 1))] = value
    return x


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 4), vocab=vocabs, seed=st.integers(0, 2**31), rounded=st.booleans(), changes=edits,
       all_low=st.booleans())
def test_row_argmax_is_torch_argmax(n, vocab, seed, rounded, changes, all_low):
    x = logits_of(n, vocab, seed, rounded, changes)
    if all_low:
        x[0] = -math.inf
    idx, value = row_argmax(x)
    assert torch.equal(idx, x.argmax(dim=-1))
    assert torch.equal(value.isnan(), x.gather(1, idx.unsqueeze(1)).squeeze(1).isnan())
    same = ~value.isnan()
    assert torch.equal(value[same], x.gather(1, idx.unsqueeze(1)).squeeze(1)[same])


@settings(max_examples=80, deadline=None)
@given(vocab=vocabs, seed=st.integers(0, 2**31), changes=edits,
       kinds=st.lists(st.sampled_from(["greedy", "t0.7", "t1.3-p0.9", "k5"]), min_size=1, max_size=4))
def test_sample_matches_the_plain_sampler(vocab, seed, changes, kinds):
    """Both CPU paths: torch's ops, and the native module's greedy rows (one pass a row for the argmax and the
    finiteness check, engine/kernels/sample_rows.cpp) where it builds."""
    n = len(kinds)
    x = logits_of(n, vocab, seed, False, changes)
    made = {"greedy": SamplingParams(temperature=0.0), "t0.7": SamplingParams(temperature=0.7),
            "t1.3-p0.9": SamplingParams(temperature=1.3, top_p=0.9), "k5": SamplingParams(temperature=1.0, top_k=5)}
    params = [made[k] for k in kinds]
    seeds = [seed + i for i in range(n)]
    want_tokens, want_failed = plain_sample(x.clone(), params, seeds)
    for native in (None, *native_modules()):
        got = sample(x, params, [torch.Generator().manual_seed(s) for s in seeds], native=native)
        assert got.token_ids == want_tokens and got.failed == want_failed


def test_any_non_finite_logit_fails_its_row_alone():
    x = torch.randn(6, 4 * ARGMAX_CHUNK)
    x[0, 7] = -math.inf  # below every other logit: argmax never reads it, the row still fails
    x[1, 3 * ARGMAX_CHUNK + 2] = math.inf
    x[2, ARGMAX_CHUNK] = math.nan
    x[3] = -math.inf
    x[4, 9] = -math.inf  # a sampled row
    params = [SamplingParams(temperature=0.0)] * 4 + [SamplingParams(temperature=1.0)] * 2
    got = sample(x, params, [torch.Generator().manual_seed(i) for i in range(6)])
    assert got.failed == [0, 1, 2, 3, 4] and got.token_ids[:5] == [None] * 5 and got.token_ids[5] is not None


def test_the_callers_logits_are_not_written():
    x = torch.randn(2, 3 * ARGMAX_CHUNK)
    x[1, 5] = math.nan
    before = x.clone()
    sample(x, [SamplingParams(temperature=0.9), SamplingParams(temperature=0.9, logprobs=2)],
           [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)])
    assert torch.equal(x.isnan(), before.isnan()) and torch.equal(x.nan_to_num(), before.nan_to_num())


def test_sampled_rows_draw_from_the_tempered_cut_distribution():
    """4,000 rows of one distribution, each its own seed: every token's share within 4.5 standard deviations of
    its probability after temperature and top-k, the tokens top-k cuts never drawn, unseeded rows too."""
    want = torch.tensor([0.4, 0.2, 0.15, 0.1, 0.1, 0.05, 1e-3, 1e-3])
    logits = (want.log() * 2.0).expand(4_000, -1).contiguous()  # temperature 2 undoes the doubling
    params = [SamplingParams(temperature=2.0, top_k=6)] * 4_000
    gens = [torch.Generator().manual_seed(i) if i % 4 else None for i in range(4_000)]
    got = sample(logits, params, gens)
    counts = torch.bincount(torch.tensor(got.token_ids), minlength=8).double()
    p = want[:6].double() / want[:6].sum()
    sd = (4_000 * p * (1 - p)).sqrt()
    assert counts[6:].sum() == 0
    assert ((counts[:6] - 4_000 * p).abs() <= 4.5 * sd).all(), (counts, 4_000 * p)
    seeded = [1, 2, 3, 5, 6, 7, 9, 10]  # a seed draws the same token again, in any row of any batch
    again = sample(logits[:8], params[:8], [torch.Generator().manual_seed(i) for i in seeded])
    assert again.token_ids == [got.token_ids[i] for i in seeded]
