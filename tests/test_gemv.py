"""The compiled single-row kernel (engine/models/layers/gemv.py) against F.linear, and when Linear uses it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.layers.gemv import CompiledGemv, gemv_math, wants_gemv
from engine.models.layers.linear import Linear


@pytest.mark.parametrize("n, k", [(96, 64), (40, 200)])
def test_gemv_matches_linear_to_bf16_rounding(n, k):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(1, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    exact = F.linear(x.float(), w.float())  # what both approximate
    for y in (gemv_math(x, w), CompiledGemv()(x, w)):
        assert y.shape == (1, n) and y.dtype == torch.bfloat16
        # fp32 accumulation, one rounding to bf16 at the end: within half a bf16 ulp of the exact value
        assert torch.allclose(y.float(), exact, rtol=2**-8, atol=1e-6)
    lib_err = (F.linear(x, w).float() - exact).abs().max()
    assert (CompiledGemv()(x, w).float() - exact).abs().max() <= lib_err * 1.01 + 1e-6


def test_linear_routes_single_16_bit_rows_only():
    calls = []

    def spy(x, w):
        calls.append(tuple(x.shape))
        return gemv_math(x, w)

    lin = Linear(8, 4, bias=True)
    torch.nn.init.normal_(lin.weight)
    torch.nn.init.normal_(lin.bias)
    lin = lin.bfloat16()
    lin.gemv = spy
    one, two = torch.randn(1, 8).bfloat16(), torch.randn(2, 8).bfloat16()
    assert torch.allclose(lin(one).float(), F.linear(one, lin.weight, lin.bias).float(), rtol=2**-7, atol=1e-2)
    lin(two)
    lin.float()(torch.randn(1, 8))  # fp32: the library path is already at full precision
    assert calls == [(1, 8)]
    assert wants_gemv(one) and not wants_gemv(two) and not wants_gemv(one.float())


@pytest.mark.slow
@pytest.mark.parametrize("pack", [False, True])
def test_compiled_bf16_decode_stays_close_to_eager(tiny_llama, pack):
    """compile=True in bf16, with and without packed weights: single-row decode goes through the
    compiled kernel; its log-probabilities match the eager engine's to bf16 precision while the greedy
    tokens agree."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                 pack_weights=pack))
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    prompt = [5, 17, 42, 8, 99, 3]

    def run():
        out = eng.generate([prompt], params)[0]
        return out.token_ids, [lp.logprob for lp in out.logprobs]

    eager_ids, eager_lp = run()
    eng.reconfigure(compile=True)
    ids, lp = run()
    assert eng.model.compiled and all(m.gemv is not None for m in eng.model.modules() if isinstance(m, Linear))
    agree = next((i for i, (a, b) in enumerate(zip(ids, eager_ids)) if a != b), len(ids))
    assert agree >= 2  # the first token comes from the prefill (library path), the second from a gemv step
    assert lp[:agree] == pytest.approx(eager_lp[:agree], abs=0.05)
    eng.reconfigure(compile=False)
    assert run()[0] == eager_ids and all(m.gemv is None for m in eng.model.modules() if isinstance(m, Linear))


def test_compiled_regions_keep_eagers_bf16_roundings():
    """The model's compiled regions round to bf16 between fused ops as eager does (a fused region that kept
    fp32 intermediates gave greedy answers other than eager's): bit-for-bit the eager result."""
    from engine.models.llama import compile_like_eager

    def chain(x, w):  # each op rounds to bf16 in eager: silu, the product, the residual add
        return x + torch.nn.functional.silu(x) * w

    torch.manual_seed(0)
    x, w = torch.randn(3, 257, dtype=torch.bfloat16), torch.randn(257, dtype=torch.bfloat16)
    assert torch.equal(compile_like_eager(chain)(x, w), chain(x, w))
