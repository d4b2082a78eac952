"""The sampler's rows and finiteness check natively (engine/kernels/sample_rows.cpp over core/rows.h,
ModelRunner.rows_kernel): torch's argmax (its first maximum) on every tier this CPU runs, -1 for a row holding
NaN or +-inf; a row sampled at its temperature draws the token the torch path draws with the same uniform
number, from the tempered distribution; the same SampleResult as the torch path, and an engine whose runner
takes it fails a poisoned request alone, as the torch path does, and draws a seeded request's tokens."""
from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kernels import kernel_module
from engine.models.layers.sampler import sample, scale_by_temperature
from tests.conftest import built_kernel, kernel_tiers
from tests.test_request_failure import PROMPTS, poison_logits, run

VOCAB_SIZES = [1, 63, 64, 65, 1000, 49152, 49155]


@pytest.mark.parametrize("tier", kernel_tiers())
def test_greedy_rows_are_torchs_argmax_and_fail_nonfinite_rows(tier):
    mod = built_kernel(kernel_module, tier)
    gen = torch.Generator().manual_seed(0)
    for vocab in VOCAB_SIZES:
        x = torch.randn(5, vocab, generator=gen)
        x[0, vocab // 3] = x[0, vocab - 1] = 9.0  # a tie: the first index, as torch.argmax
        x[1] = x[1].round()  # many ties at the top
        assert torch.equal(mod.greedy_rows(x), x.argmax(dim=-1)), vocab
        assert torch.equal(mod.greedy_rows(x[1:4]), x[1:4].argmax(dim=-1))  # a view: rows apart by the stride
        strided = torch.randn(3, 2 * vocab, generator=gen)[:, :vocab]
        assert torch.equal(mod.greedy_rows(strided), strided.argmax(dim=-1))
    x = torch.randn(6, 49152, generator=gen)
    x[1, 5], x[2, 100], x[3, 49151], x[4] = math.nan, math.inf, -math.inf, -math.inf  # (row 4: all -inf)
    x[5, 49150] = math.nan  # in the last block
    got = mod.greedy_rows(x)
    assert got[0] == x[0].argmax() and (got[1:] == -1).all()
    tail = torch.randn(2, 49155, generator=gen)
    tail[1, 49154] = math.inf  # in the tail after the last whole block of 64
    assert mod.greedy_rows(tail).tolist() == [int(tail[0].argmax()), -1]
    with pytest.raises(RuntimeError, match="float32"):
        mod.greedy_rows(x.double())
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.greedy_rows(x.t())


def _torch_draw(x: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The torch path's draw (sampler.shape_logits' scaling, softmax, draw_rows' inverse CDF) from given u."""
    mass = scale_by_temperature(x, temperature).softmax(dim=-1).double().cumsum(dim=-1)
    return torch.searchsorted(mass, (u * mass[:, -1]).unsqueeze(1), right=True).squeeze(1)


def _same_draws(got: torch.Tensor, x: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor) -> bool:
    """got is the torch path's draw row by row, but where u falls so near the boundary of two tokens that the
    two ways of rounding the cumulative mass (float32 terms, sums kept differently) part: there the mass
    from one token to the other is below 1e-6 of the row's."""
    want = _torch_draw(x, temperature, u)
    probs = scale_by_temperature(x, temperature).softmax(dim=-1).double()
    for r in (got != want).nonzero().flatten().tolist():
        a, b = sorted((int(got[r]), int(want[r])))
        if a < 0 or probs[r, a:b].sum() > 1e-6:
            return False
    return True


@pytest.mark.parametrize("tier", kernel_tiers())
def test_sampled_rows_draw_the_torch_paths_token_from_the_same_uniform_number(tier):
    mod = built_kernel(kernel_module, tier)
    gen = torch.Generator().manual_seed(2)
    for vocab in VOCAB_SIZES:
        x = torch.randn(64, vocab, generator=gen) * 4
        temperature = torch.rand(64, generator=gen) * 2 + 0.05
        u = torch.rand(64, dtype=torch.float64, generator=gen)
        assert _same_draws(mod.sample_rows(x, temperature, u), x, temperature, u), vocab
        strided = torch.randn(3, 2 * vocab, generator=gen)[:, :vocab]  # rows apart by the stride
        assert _same_draws(mod.sample_rows(strided, temperature[:3], u[:3]), strided, temperature[:3], u[:3])
        greedy = torch.zeros(64)  # temperature 0: the greedy token, u unread
        assert torch.equal(mod.sample_rows(x, greedy, u), x.argmax(dim=-1))
    x = torch.randn(6, 49155, generator=gen)
    x[1, 5], x[2, 100], x[3, 49151], x[4, 49154] = math.nan, math.inf, -math.inf, math.nan  # (49154: the tail)
    got = mod.sample_rows(x, torch.full((6,), 0.7), torch.full((6,), 0.5, dtype=torch.float64))
    assert got[0] >= 0 and got[5] >= 0 and (got[1:5] == -1).all()
    # a temperature whose inverse is not finite draws the greedy token; a huge one flattens the row
    x = torch.randn(2, 1000, generator=gen)
    got = mod.sample_rows(x, torch.tensor([1e-45, 1e30]), torch.tensor([0.999, 0.5], dtype=torch.float64))
    assert got[0] == x[0].argmax() and abs(int(got[1]) - 500) <= 1
    # tokens of no mass (e^-1000) are never drawn, at either end of u's range
    x = torch.full((2, 1000), -1000.0)
    x[:, 10] = x[:, 900] = 0.0
    got = mod.sample_rows(x, torch.ones(2), torch.tensor([0.0, 1 - 2**-53], dtype=torch.float64))
    assert got.tolist() == [10, 900]
    for temperature, u in (([-1.0], [0.5]), ([math.nan], [0.5]), ([1.0], [1.0]), ([1.0], [-0.1])):
        with pytest.raises(RuntimeError, match="temperature >= 0 and u in"):
            mod.sample_rows(torch.zeros(1, 10), torch.tensor(temperature), torch.tensor(u, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="float64"):
        mod.sample_rows(torch.zeros(1, 10), torch.ones(1), torch.zeros(1))


def test_sampled_rows_follow_the_tempered_distribution():
    """200,000 draws of one row at temperature 0.5: each token's share within 4 standard deviations of its
    probability, softmax(logits / 0.5); the tokens of negligible mass never come."""
    mod = _native()
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5] + [-60.0] * 124)
    n = 200_000
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = mod.sample_rows(logits.expand(n, -1).contiguous(), torch.full((n,), 0.5), u)
    share = torch.bincount(got, minlength=128).double() / n
    want = torch.softmax(logits.double() / 0.5, dim=-1)
    sd = (want * (1 - want) / n).sqrt()
    assert ((share[:4] - want[:4]).abs() <= 4 * sd[:4] + 1e-9).all(), (share[:4], want[:4])
    assert share[4:].sum() == 0


def _native():
    mod = kernel_module()
    if mod is None:
        pytest.skip("no C++ toolchain to build the kernels")
    return mod


@pytest.mark.parametrize("mix", ["greedy", "mixed", "logprobs", "temperature"])
def test_sample_with_the_native_rows_gives_the_torch_paths_result(mix):
    mod = _native()
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 4096, generator=gen) * 3
    logits[2, 17] = math.nan
    logits[4, 99] = -math.inf
    greedy = SamplingParams(temperature=0.0, logprobs=3 if mix == "logprobs" else None)
    sampled = SamplingParams(temperature=0.9, top_k=50, seed=3)  # top-k: a row for the torch path
    tempered = SamplingParams(temperature=0.9, seed=3)  # temperature alone: drawn natively
    params = [greedy if mix in ("greedy", "logprobs") or i % 2 else sampled if mix == "mixed" else tempered
              for i in range(6)]
    if mix == "temperature":
        params[5] = sampled

    def run(native):
        gens = [torch.Generator().manual_seed(i) for i in range(6)]
        extra = torch.tensor([7, 8, 9])
        return sample(logits.clone(), params, gens, extra=extra, native=native)

    want, got = run(None), run(mod)
    assert got.failed == want.failed == [2, 4]
    assert got.token_ids == want.token_ids and got.token_ids[2] is None and got.token_ids[4] is None
    assert got.extra == want.extra == [7, 8, 9]
    assert got.logprobs == want.logprobs
    if mix == "logprobs":
        assert got.logprobs[0] is not None and got.logprobs[2] is None


def _engine(model, native_rows: bool) -> LLMEngine:
    """bf16 on the CPU with the native decode attention (its runner samples with the native rows), or the
    same engine on the torch path (native_rows False)."""
    eng = LLMEngine(EngineConfig(model=str(model), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                 fused_decode=False))
    assert eng.runner.rows_kernel is not None
    if not native_rows:
        eng.runner.rows_kernel = None
    return eng


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_an_engine_on_the_native_rows_fails_a_poisoned_request_alone(tiny_llama_hd64, value):
    """bf16 on the CPU with the native decode attention (not the fused step: its own argmax): the runner
    samples with the native rows; one request's NaN / inf logits fail it alone, the others get the
    tokens the torch path gives them."""
    _native()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)

    def outputs(native_rows: bool):
        eng = _engine(tiny_llama_hd64, native_rows)
        poison_logits(eng, value)  # the second prompt's rows (its first token is POISON)
        done, _ = run(eng, params)
        assert eng.block_manager.num_used_blocks == 0
        return [done[i] for i in range(len(PROMPTS))]

    native, reference = outputs(True), outputs(False)
    assert [o.finish_reason for o in native] == [o.finish_reason for o in reference]
    assert [o.token_ids for o in native] == [o.token_ids for o in reference]
    assert native[1].finish_reason == "error" and "non-finite" in native[1].error
    assert all(o.finish_reason == "length" for i, o in enumerate(native) if i != 1)


def test_the_reference_path_and_the_portable_tier_keep_torchs_ops():
    from engine.models.layers.attention import AttentionBackend
    from engine.runner.model_runner import rows_kernel

    mod = _native()
    assert rows_kernel(AttentionBackend(native_decode=mod), None) is mod
    assert rows_kernel(AttentionBackend(native_decode=mod, reference=True), None) is None  # the readable path
    assert rows_kernel(AttentionBackend(), None) is None  # no native module runs: none is built for it

    class Portable:
        def greedy_rows(self, x):
            raise AssertionError("not called")

        def tier(self):
            return "portable"

    assert rows_kernel(AttentionBackend(native_decode=Portable()), None) is None


def test_an_engine_on_the_native_rows_draws_a_seeded_requests_tokens(tiny_llama_hd64):
    """Sampled requests (temperature alone, and one with top-p for the torch path) on the native rows and on
    the torch path: the same tokens for the same seeds (the same uniform numbers, the same inverse CDF)."""
    _native()
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14]]
    params = [SamplingParams(max_tokens=12, temperature=t, top_p=p, seed=s, ignore_eos=True)
              for t, p, s in ((0.8, 1.0, 1), (1.3, 1.0, 2), (0.9, 0.9, 3))]

    def tokens(native_rows: bool):
        return [list(o.token_ids) for o in _engine(tiny_llama_hd64, native_rows).generate(prompts, params)]

    native = tokens(True)
    assert native == tokens(False)
    assert len({tuple(t) for t in native}) == 3 and all(len(t) == 12 for t in native)
