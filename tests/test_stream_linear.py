"""The native weight-streaming linear kernel (engine/kernels/stream_linear.cpp) against the
reference products, on every ISA tier this CPU runs; the layers that route to it; and an
engine with it against one without (one copy of the weights, same greedy tokens)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import stream_linear_kernel
from engine.models.layers.linear import Linear, set_stream_kernel
from engine.quant.weight_only import QuantLinear, pack_int4_chunks, unpack_int4_chunks
from tests.conftest import built_kernel, kernel_tiers


@pytest.fixture(scope="module", params=kernel_tiers())
def kernel(request):
    return built_kernel(stream_linear_kernel, request.param)


def close_to(y: torch.Tensor, exact: torch.Tensor) -> None:
    """fp32 sums rounded once to bf16: within a bf16 ulp of the exact value (scaled by the output's size)."""
    assert y.dtype == torch.bfloat16 and y.shape == exact.shape
    tol = 2**-7 * exact.abs().max().item() + 1e-3
    assert (y.float() - exact).abs().max().item() <= tol


@pytest.mark.parametrize("rows", [1, 2, 5, 7, 8])
@pytest.mark.parametrize("n, k", [(96, 64), (37, 200), (130, 576)])
def test_bf16_rows_match_the_exact_product(kernel, rows, n, k):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    close_to(kernel.stream_linear_bf16(x, w, None), x.float() @ w.float().t())
    close_to(kernel.stream_linear_bf16(x, w, b), x.float() @ w.float().t() + b.float())


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("n, k", [(37, 200), (130, 576), (9, 1544)])
def test_bf16_rows_together_are_bit_for_bit_the_rows_alone(kernel, rows, n, k):
    # a verify's rows, a batch's rows: the same numbers as one-row decoding, so drafting or batching never
    # changes a greedy token (every tier, every row count up to 8)
    g = torch.Generator().manual_seed(rows * 7 + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    together = kernel.stream_linear_bf16(x, w, b)
    alone = torch.cat([kernel.stream_linear_bf16(x[i:i + 1], w, b) for i in range(rows)])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("n, k", [(37, 200), (130, 1544)])
def test_bf16_walks_give_the_same_numbers(kernel, rows, n, k):
    # the walks of W the tier choice times (core/linear.h: tiles, rows, and rows with each line asked for
    # ahead, "stream") differ in speed only: each sums every (weight row, row of x) in one order
    g = torch.Generator().manual_seed(rows * 13 + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    before = kernel.bf16_body()
    outs = {}
    try:
        for body in ("tiles", "rows", "stream"):
            kernel.set_bf16_body(body)
            assert kernel.bf16_body() == body
            outs[body] = kernel.stream_linear_bf16(x, w, b)
        with pytest.raises(RuntimeError, match="tiles, rows or stream"):
            kernel.set_bf16_body("columns")
    finally:
        kernel.set_bf16_body(before)
    close_to(outs["stream"], x.float() @ w.float().t() + b.float())
    assert torch.equal(outs["stream"], outs["tiles"]) and torch.equal(outs["rows"], outs["tiles"])


@pytest.mark.parametrize("rows", [9, 17, 40])
def test_bf16_many_rows_are_bit_for_bit_the_rows_alone(kernel, rows):
    # a prompt's rows (where bf16 is emulated) or a large batch in one call, W read over in blocks (more than
    # one block of 64 weight rows here): each row the same numbers as alone, so a prompt's K/V do not depend
    # on how it was chunked
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 200, generator=g).bfloat16()
    w = torch.randn(150, 200, generator=g).bfloat16()
    b = torch.randn(150, generator=g).bfloat16()
    together = kernel.stream_linear_bf16(x, w, b)
    assert torch.equal(together, torch.cat([kernel.stream_linear_bf16(x[i:i + 1], w, b) for i in range(rows)]))
    close_to(together, x.float() @ w.float().t() + b.float())


def test_bf16_refuses_no_rows(kernel):
    with pytest.raises(RuntimeError, match="at least one row"):
        kernel.stream_linear_bf16(torch.zeros(0, 64).bfloat16(), torch.zeros(4, 64).bfloat16(), None)


@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("n, k, group", [(64, 128, 32), (33, 256, 64), (40, 576, 32), (16, 256, 128)])
def test_int4_codes_match_the_dequantized_product(kernel, rows, n, k, group):
    g = torch.Generator().manual_seed(rows * 100 + n)
    q = torch.randint(0, 16, (n, k), generator=g)
    sz = torch.randn(n, k // group, 2, generator=g).bfloat16()
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = ((q.float().reshape(n, -1, group) - 8) * sz[..., :1].float() + sz[..., 1:].float()).reshape(n, k)
    codes = pack_int4_chunks(q)
    assert codes.shape == (n, k // 2) and torch.equal(kernel.pack_int4(q), codes)  # one layout, two packers
    assert torch.equal(unpack_int4_chunks(codes), q)
    close_to(kernel.stream_linear_int4(x, codes, sz, group, None), x.float() @ w.t())


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("n, k", [(64, 128), (37, 200)])
def test_int8_rows_match_the_dequantized_product(kernel, rows, n, k):
    g = torch.Generator().manual_seed(rows + n)
    q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    scales = torch.rand(n, generator=g).bfloat16() / 50
    x = torch.randn(rows, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    exact = x.float() @ (q.float() * scales.float()[:, None]).t() + b.float()
    close_to(kernel.stream_linear_int8(x, q, scales, b), exact)


def bf16_linear(n: int, k: int, bias: bool = True) -> Linear:
    g = torch.Generator().manual_seed(n + k)
    lin = Linear(k, n, bias=bias)
    lin.weight.data = torch.randn(n, k, generator=g)
    if bias:
        lin.bias.data = torch.randn(n, generator=g)
    return lin.bfloat16()


def test_linear_routes_few_rows_to_the_kernel_and_more_to_the_library(kernel):
    lin = bf16_linear(48, 96)
    calls = []

    class Spy:
        def stream_linear_bf16(self, x, w, b):
            calls.append(x.shape[0])
            return kernel.stream_linear_bf16(x, w, b)

    lin.stream = Spy()
    for rows in (1, 8, 9, 40):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)).bfloat16()
        close_to(lin(x), F.linear(x.float(), lin.weight.float(), lin.bias.float()))
    assert calls == [1, 8]  # 9 and 40 rows: the library GEMM on the same single copy


def test_compiled_regions_call_the_kernels_without_a_graph_break():
    mod = stream_linear_kernel()
    if mod is None:
        pytest.skip("no C++ toolchain")
    lin = bf16_linear(128, 128)
    torch.manual_seed(0)
    q4 = QuantLinear(torch.randn(32, 128).bfloat16(), None, "int4", 32)
    q8 = QuantLinear(torch.randn(16, 32).bfloat16(), None, "int8", 32)
    set_stream_kernel(torch.nn.ModuleList([lin, q4, q8]), mod)

    def region(x):
        return q8(q4(F.silu(lin(x))))

    compiled = torch.compile(region, dynamic=True, fullgraph=True)  # fullgraph: a break would raise
    for rows in (1, 5):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows)).bfloat16()
        torch.testing.assert_close(compiled(x).float(), region(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_engine_with_the_kernel_decodes_the_same_tokens_and_keeps_one_copy(tiny_llama_hd64, fmt):
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.runner.memory import weights_bytes

    def make(stream):
        return LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=64,
                                      quant_format=fmt, stream_linear=stream, quant_reference=not stream))

    fast, ref = make(True), make(False)
    assert fast.model.lm_head.stream is not None and ref.model.lm_head.stream is None
    if fmt == "bf16":  # the same bf16 products, rounded once each: the same greedy tokens
        p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        prompts = ["Hello world", "The quick brown fox"]
        assert [o.token_ids for o in fast.generate(prompts, p)] == [o.token_ids for o in ref.generate(prompts, p)]
    else:  # the reference rounds the dequantized weights to bf16 first, the kernels do not: logits close
        ids = fast.tokenizer.encode("The quick brown fox jumps over the lazy dog. Paged attention stores keys")
        a, b = fast.score(ids), ref.score(ids)
        assert float((a - b).norm() / b.norm()) < 0.05  # (int4 itself moves them ~10x more from bf16)
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
    # one copy of every weight: what the engine reports is what its tensors hold, no packed extra
    assert fast.memory().weights_bytes == weights_bytes(fast.model) and fast.packed_bytes == 0


def quantized_rows(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x as the int8-activation kernels see it: rounded to int8 per block of 32 columns (absmax scale)."""
    xf = x.float()
    k = xf.shape[1]
    pad = (-k) % block
    xb = torch.nn.functional.pad(xf, (0, pad)).view(xf.shape[0], -1, block)
    d = xb.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(xb / torch.where(d > 0, d, 1)), 0)
    return (q * d).view(xf.shape[0], -1)[:, :k]


@pytest.mark.parametrize("rows", [1, 3, 4, 6])
@pytest.mark.parametrize("n, k, group", [(64, 128, 32), (33, 576, 32), (40, 576, 64), (16, 1536, 128), (5, 64, 32)])
def test_int4_with_int8_activations_is_the_product_of_the_rounded_row(kernel, rows, n, k, group):
    g = torch.Generator().manual_seed(rows * 7 + n + k)
    q = torch.randint(0, 16, (n, k), generator=g)
    sz = torch.randn(n, k // group, 2, generator=g).bfloat16()
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = ((q.float().reshape(n, -1, group) - 8) * sz[..., :1].float() + sz[..., 1:].float()).reshape(n, k)
    y = kernel.stream_linear_int4_q8(x, pack_int4_chunks(q), sz, group)
    want = quantized_rows(x) @ w.t()  # the weights times x as rounded, both terms
    close_to(y, want)
    assert (y.float() - want).norm() / want.norm() < 0.005  # bf16 output rounding, not x's rounding again
    # what the rounding costs: x itself moves by well under 1 % (8 bits per value, one scale per 32)
    assert (quantized_rows(x) - x.float()).norm() / x.float().norm() < 0.01


@pytest.mark.parametrize("rows", [1, 2, 8, 9, 21])  # past 8: passes of 8 rows (prompt rows)
@pytest.mark.parametrize("n, k", [(64, 128), (37, 200), (130, 576), (3, 20)])
def test_int8_with_int8_activations_is_the_product_of_the_rounded_row(kernel, rows, n, k):
    g = torch.Generator().manual_seed(rows + 3 * n + k)
    q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    scales = torch.rand(n, generator=g).bfloat16() / 50
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = q.float() * scales.float()[:, None]
    y, want = kernel.stream_linear_int8_q8(x, q, scales), quantized_rows(x) @ w.t()
    close_to(y, want)
    assert (y.float() - want).norm() / want.norm() < 0.005
    if rows > 8:  # each row's result is its own, whichever pass it is in
        assert torch.equal(kernel.stream_linear_int8_q8(x[-1:], q, scales)[0], y[-1])


@pytest.mark.parametrize("tier", ["neon", "avx2"])
def test_where_bf16_is_emulated_a_decode_batch_streams_instead_of_widening(kernel, monkeypatch, tier):
    """matmul_dtype fp32 (a CPU without native bf16): up to 32 decode rows go through the kernel in one call
    (8 rows a pass over each block of the weight), each row as the kernel computes it alone, instead of
    widening the whole weight to fp32. Prompt rows and larger batches take the widened GEMM, but for the
    tiers of PROMPT_STREAM_TIERS (the AVX2 body), where every row of any count streams."""
    from engine.models.layers import linear as linear_mod

    lin = bf16_linear(48, 96)
    lin.matmul_dtype = torch.float32
    calls, widened = [], []

    class Spy:
        def stream_linear_bf16(self, x, w, b):
            calls.append(x.shape[0])
            return kernel.stream_linear_bf16(x, w, b)

        def tier(self):
            return tier

    real_widened = linear_mod.widened_linear
    monkeypatch.setattr(linear_mod, "widened_linear", lambda x, *a: widened.append(x.shape[0]) or real_widened(x, *a))
    lin.stream = Spy()
    x = torch.randn(20, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    y = lin(x)
    assert calls == [20] and widened == []
    assert torch.equal(y, torch.cat([kernel.stream_linear_bf16(p, lin.weight, lin.bias) for p in x.split(8)]))
    lin(torch.randn(33, 96).bfloat16())  # more rows than a handful of chunks
    token = linear_mod.PROMPT_ROWS.set(True)
    try:
        prompt = lin(x)  # a prompt's rows
    finally:
        linear_mod.PROMPT_ROWS.reset(token)
    if tier in linear_mod.PROMPT_STREAM_TIERS:
        assert widened == [] and calls == [20, 33, 20] and torch.equal(prompt, y)
    else:
        assert widened == [33, 20] and calls == [20]
