"""oneDNN-packed weights (engine/models/layers/linear.py): the same products as F.linear, inside compiled regions
too, counted in the engine's weight bytes, refreshed when a requantization swaps the layers."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.layers import linear as linear_module
from engine.models.layers.linear import Linear, onednn_packs_bf16, pack_linears

needs_packing = pytest.mark.skipif(not onednn_packs_bf16(), reason="oneDNN does not pack bf16 on this CPU (AVX2)")


def bf16_linear(n: int, k: int, seed: int) -> Linear:
    g = torch.Generator().manual_seed(seed)
    lin = Linear(k, n, bias=True)
    lin.weight.data = torch.randn(n, k, generator=g)
    lin.bias.data = torch.randn(n, generator=g)
    return lin.bfloat16()


@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 47])
def test_packed_linear_matches_the_library_product(rows):
    lin = bf16_linear(96, 200, rows)
    x = torch.randn(rows, 200, generator=torch.Generator().manual_seed(7)).bfloat16()
    plain = lin(x)
    lin.pack()
    assert lin.packed is not None and lin.packed_bytes() == 96 * 200 * 2
    exact = F.linear(x.float(), lin.weight.float(), lin.bias.float())
    packed = lin(x)
    assert packed.dtype == torch.bfloat16 and packed.shape == (rows, 96)
    # both round an fp32-accumulated product to bf16: within one bf16 ulp of the exact value and of each other
    assert torch.allclose(packed.float(), exact, rtol=2**-7, atol=1e-2)
    assert torch.allclose(packed.float(), plain.float(), rtol=2**-7, atol=1e-2)
    lin.unpack()
    assert lin.packed is None and torch.equal(lin(x), plain)


def test_only_bf16_cpu_weights_are_packed():
    lin = Linear(8, 4)
    lin.pack()  # float32: the library path is already at full precision
    assert lin.packed is None and lin.packed_bytes() == 0


def test_where_onednn_does_not_pack_bf16_nothing_is_packed_and_the_engine_serves(tiny_llama, monkeypatch):
    """An AVX2-only CPU: oneDNN refuses bf16 packing (a RuntimeError from _reorder_linear_weight); asking
    for packed weights there packs nothing, holds no extra bytes, and the engine answers as unpacked."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    monkeypatch.setattr(linear_module, "onednn_packs_bf16", lambda: False)
    lin = bf16_linear(16, 32, 0)
    lin.pack()
    assert lin.packed is None and lin.packed_bytes() == 0

    def answer(pack):
        eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                     pack_weights=pack))
        out = eng.generate([[5, 17, 42, 8]], SamplingParams(max_tokens=4, temperature=0.0))[0].token_ids
        return eng.memory().packed_weights_bytes, out

    packed_bytes, tokens = answer(True)
    assert packed_bytes == 0 and (0, tokens) == answer(False)


@needs_packing
def test_compiled_region_calls_the_packed_weights_without_a_graph_break():
    lin = bf16_linear(64, 32, 1)
    lin.pack()

    def region(x):
        return F.silu(lin(x)) * 2

    compiled = torch.compile(region, dynamic=True, fullgraph=True)  # fullgraph: a break would raise
    for rows in (1, 5):
        x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows)).bfloat16()
        assert torch.allclose(compiled(x).float(), region(x).float(), rtol=2**-7, atol=2e-2)


@needs_packing
@pytest.mark.slow
def test_engine_packs_counts_and_repacks_after_requantization(tiny_llama):
    from engine import EngineConfig, LLMEngine, SamplingParams

    def make(pack):
        return LLMEngine(EngineConfig(model=str(tiny_llama), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                      pack_weights=pack))

    packed, plain = make(True), make(False)
    linears = [m for m in packed.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed is not None for m in linears)
    assert all(m.packed is None for m in plain.model.modules() if isinstance(m, Linear))
    extra = sum(m.weight.numel() * 2 for m in linears)  # a second bf16 copy of every Linear weight
    assert packed.memory().weights_bytes - plain.memory().weights_bytes == extra
    assert packed.memory().packed_weights_bytes == extra and plain.memory().packed_weights_bytes == 0
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    prompts = [[5, 17, 42, 8, 99, 3], [9, 4, 4, 61, 2]]
    res = {}
    for name, eng in (("packed", packed), ("plain", plain)):
        res[name] = [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in eng.generate(prompts, params)]
    for (ids_p, lp_p), (ids_q, lp_q) in zip(res["packed"], res["plain"]):
        agree = next((i for i, (a, b) in enumerate(zip(ids_p, ids_q)) if a != b), len(ids_p))
        assert agree >= 3  # bf16 near-ties may flip later tokens
        assert lp_p[:agree] == pytest.approx(lp_q[:agree], abs=0.05)
    before = packed.memory().weights_bytes
    packed.set_quantization("int8")
    packed.step()  # the swap lands between steps
    assert not any(isinstance(m, Linear) and m.packed is not None and m is not packed.model.lm_head
                   for m in packed.model.modules())
    packed.set_quantization("bf16")
    packed.step()
    assert all(m.packed is not None for m in packed.model.modules() if isinstance(m, Linear))
    assert packed.memory().weights_bytes == before
    assert pack_linears(packed.model, on=False) == 0
    assert all(m.packed is None for m in packed.model.modules() if isinstance(m, Linear))
