"""Sampling parameters at their extremes (issue 12, point 1), property-based: every value either fails
validation with a ValueError naming its field, or samples a real token, numerically safe, through the
sampler and through a running engine whose other requests carry on."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models.layers.sampler import apply_top_k_top_p, sample, scale_by_temperature
from engine.sampling_params import FLOAT32_TINY, MAX_TOP_K, SEED_MAX, SEED_MIN
from engine.spec.verify import target_probs

VOCAB = 50
FUZZ = settings(max_examples=300, deadline=None)

# every float, biased towards the edges: subnormals, float32 underflow / overflow, 0, 1, inf, NaN
any_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1e-30),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-45, 1e-39, FLOAT32_TINY, 1e-38, 1e-30, 1e-7, 1.0, 1.0 + 1e-16,
                     3.4028234663852886e38, 3.5e38, 1e300, math.inf, -math.inf, math.nan, -1e-300]),
)
any_int = st.one_of(st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
                    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63),
                                     -(2**63) - 1, True, False]))


def build(**kw) -> SamplingParams | None:
    """The params, or None when validation refused them (with a ValueError, never anything else)."""
    try:
        return SamplingParams(**kw)
    except ValueError as exc:
        assert str(exc)  # says why
        return None


def logits_strategy(n: int):
    """(n, VOCAB) float32 logits, finite, from gentle to float32's extremes."""
    magnitude = st.sampled_from([1.0, 30.0, 1e4, 1e30, 3e38])
    return st.tuples(st.integers(0, 2**32 - 1), magnitude).map(
        lambda t: (torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(t[0])) * t[1]).clamp(-3e38, 3e38))


def assert_samples(params: SamplingParams, logits: torch.Tensor) -> None:
    gen = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
    result = sample(logits, [params] * logits.shape[0], [gen] * logits.shape[0])
    assert result.failed == []
    for row, token in zip(logits, result.token_ids):
        assert 0 <= token < VOCAB
        if params.greedy or params.top_k == 1:
            assert row[token] == row.max()
        elif params.top_k:
            assert row[token] >= row.topk(min(params.top_k, VOCAB)).values[-1]


@FUZZ
@given(t=any_float, logits=logits_strategy(3))
def test_temperature_validates_or_samples(t, logits):
    params = build(temperature=t, seed=1)
    finite_ok = isinstance(t, float) and math.isfinite(t) and (t == 0 or FLOAT32_TINY <= t <= 3.4028234663852886e38)
    assert (params is not None) == finite_ok
    if params is not None:
        assert_samples(params, logits)


@FUZZ
@given(p=any_float, t=st.sampled_from([0.0, FLOAT32_TINY, 1e-20, 0.7, 1.0, 1e30]), logits=logits_strategy(2))
def test_top_p_validates_or_samples(p, t, logits):
    params = build(top_p=p, temperature=t, seed=2)
    assert (params is not None) == (isinstance(p, float) and FLOAT32_TINY <= p <= 1.0)
    if params is not None:
        assert_samples(params, logits)
        probs = target_probs(logits, params)  # the speculative verifier's distribution too
        assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2))


@FUZZ
@given(k=any_int, logits=logits_strategy(2))
def test_top_k_validates_or_samples(k, logits):
    params = build(top_k=k, temperature=0.9, top_p=0.5, seed=3)
    assert (params is not None) == (type(k) is int and 0 <= k <= MAX_TOP_K)
    if params is not None:
        assert_samples(params, logits)


@FUZZ
@given(seed=any_int)
def test_seed_validates_or_seeds_a_generator(seed):
    params = build(seed=seed, temperature=1.0)
    assert (params is not None) == (type(seed) is int and SEED_MIN <= seed <= SEED_MAX)
    if params is not None:
        torch.Generator().manual_seed(params.seed)  # what the engine does when it drains the request


@FUZZ
@given(field=st.sampled_from(["max_tokens", "logprobs", "temperature", "top_p", "top_k", "seed"]),
       value=st.one_of(st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2), st.booleans()))
def test_wrong_types_are_value_errors(field, value):
    if value is None and field in ("logprobs", "seed"):
        return  # None means off / unseeded there
    assert build(**{field: value}) is None


@FUZZ
@given(logits=logits_strategy(4), t=st.sampled_from([FLOAT32_TINY, 1e-30, 1.0, 3.4028234663852886e38]))
def test_scaled_logits_never_nan(logits, t):
    scaled = scale_by_temperature(logits, torch.full((4,), t))
    assert not scaled.isnan().any() and (scaled.amax(-1) == 0).all()
    kept = apply_top_k_top_p(scaled, torch.tensor([0, 1, 7, 2**31 - 1]), torch.full((4,), FLOAT32_TINY))
    assert torch.isfinite(kept.amax(-1)).all()  # the top token always survives


def test_nonfinite_rows_fail_alone_in_the_sampler():
    logits = torch.randn(4, VOCAB)
    logits[1, 3] = math.nan
    logits[2, 0] = math.inf
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.8, top_p=0.9, logprobs=2), SamplingParams(temperature=0.8, logprobs=2)]
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    result = sample(logits, params, gens)
    assert result.failed == [1, 2]
    assert result.token_ids[1] is None and result.token_ids[2] is None  # never a silent token 0
    assert result.token_ids[0] == int(logits[0].argmax()) and result.token_ids[3] is not None
    assert result.logprobs[2] is None and result.logprobs[3] is not None


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=any_float, p=any_float, k=any_int, seed=st.one_of(st.none(), any_int))
def test_engine_refuses_at_add_request_or_serves(engine, t, p, k, seed):
    """Through add_request: a bad value is a ValueError there (the HTTP layer's 400), a good one runs
    beside a plain greedy request, and neither the batch nor the other request is harmed."""
    other = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    try:
        params = SamplingParams(temperature=t, top_p=p, top_k=k, seed=seed, max_tokens=3, ignore_eos=True)
    except ValueError:
        params = None
    rid = engine.add_request([8, 9], params) if params is not None else None
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert done[other].finish_reason == "length" and len(done[other].token_ids) == 3
    if rid is not None:
        assert done[rid].finish_reason == "length" and all(0 <= x < engine.model_config.vocab_size
                                                            for x in done[rid].token_ids)
    assert engine.block_manager.num_used_blocks == 0
