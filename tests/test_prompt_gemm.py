"""Many rows of a quantized layer (prompt rows). On a CPU that multiplies bf16 natively the native kernels
dequantize the weight (core/dequant.h) into a per-thread scratch buffer and the library GEMM multiplies it
(engine/quant/schemes.py gemm_for_many_rows); elsewhere, with int8_activations on, the int8-activation kernels
take them (int8_many_rows). Held to: the dequantized weight bit for bit the reference's on every tier; each
route taken only where it should be; its result the reference path's (or the int8 kernel's), each row alone as
in company; an engine's greedy answer the same on a prefix-cache hit, on both routes."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kernels import stream_linear_kernel
from engine.models.layers.linear import INT8_ROWS, PROMPT_ROWS
from engine.quant import schemes
from engine.quant.weight_only import QuantLinear
from tests.conftest import built_kernel, kernel_tiers


@pytest.fixture(scope="module", params=kernel_tiers())
def kernel(request):
    return built_kernel(stream_linear_kernel, request.param)


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).bfloat16()


def _dequant(kernel, layer: QuantLinear) -> torch.Tensor:
    out = torch.full((layer.out_features, layer.in_features), float("nan"), dtype=torch.bfloat16)
    if layer.format.name == "int8":
        return kernel.dequant_int8(layer.qweight, layer.scales, out)
    fn = kernel.dequant_int4_tiles if layer.int4_tiles else kernel.dequant_int4
    return fn(layer.codes, layer.scale_zero, layer.group_size, out)


@pytest.mark.parametrize("layout", ["tiles", "chunks"])
@pytest.mark.parametrize("shape", [(3072, 576, 32), (576, 1536, 64), (64, 256, 128), (32, 64, 32)])
def test_int4_dequantized_bit_for_bit_as_the_reference(kernel, layout, shape):
    n, k, group = shape
    layer = QuantLinear(_weight(n, k), None, "int4", group, int4_layout=layout)
    got = _dequant(kernel, layer)
    assert torch.equal(got, layer.dequantize().bfloat16())  # every element written (no NaN left), each exact


@pytest.mark.parametrize("shape", [(3072, 576), (7, 200), (1, 1)])
def test_int8_dequantized_bit_for_bit_as_the_reference(kernel, shape):
    layer = QuantLinear(_weight(*shape, seed=1), None, "int8", 0)
    assert torch.equal(_dequant(kernel, layer), layer.dequantize().bfloat16())


def test_extreme_scales_round_as_torch_does(kernel):
    """Scales and zeros from the top and bottom of bf16's range (and a NaN, as a lying file could carry):
    the int8 and the plain int4 bodies round as torch; the AVX-512 int4 body may flush float32 denormals."""
    layer = QuantLinear(_weight(64, 128, seed=2), None, "int4", 32, int4_layout="chunks")
    sz = layer.scale_zero.view(-1)
    sz[0], sz[1], sz[6], sz[7], sz[12] = 3.0e38, -3.0e38, 1e-30, 2e-30, float("nan")
    got, want = _dequant(kernel, layer), layer.dequantize().bfloat16()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    assert torch.equal(got[finite], want[finite])
    q8 = QuantLinear(_weight(4, 64, seed=3), None, "int8", 0)
    q8.scales[0], q8.scales[1] = 3.0e38, float("nan")
    got8, want8 = _dequant(kernel, q8), q8.dequantize().bfloat16()
    assert torch.equal(got8.isnan(), want8.isnan())
    assert torch.equal(got8[~want8.isnan()], want8[~want8.isnan()])


def test_bad_operands_are_refused(kernel):
    layer = QuantLinear(_weight(64, 128), None, "int4", 32, int4_layout="tiles")
    with pytest.raises(RuntimeError, match="contiguous bf16 tensor of shape"):
        kernel.dequant_int4_tiles(layer.codes, layer.scale_zero, 32, torch.empty(128, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="contiguous bf16 tensor of shape"):
        kernel.dequant_int4_tiles(layer.codes, layer.scale_zero, 32, torch.empty(64, 128))
    with pytest.raises(RuntimeError, match="contiguous bf16 tensor of shape"):
        kernel.dequant_int4_tiles(layer.codes, layer.scale_zero, 32, torch.empty(128, 64, dtype=torch.bfloat16).t())
    with pytest.raises(RuntimeError, match="int4 tiles"):  # rows not whole tiles
        kernel.dequant_int4_tiles(layer.codes[:40], layer.scale_zero[:40], 32,
                                  torch.empty(40, 128, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="int4"):  # a group the scales were not made with
        kernel.dequant_int4(layer.codes, layer.scale_zero, 64, torch.empty(64, 128, dtype=torch.bfloat16))
    q8 = QuantLinear(_weight(8, 64), None, "int8", 0)
    with pytest.raises(RuntimeError, match="scales"):
        kernel.dequant_int8(q8.qweight, q8.scales[:4], torch.empty(8, 64, dtype=torch.bfloat16))


class _Spy:
    """The kernel module, counting the dequantizing calls."""

    def __init__(self, kernel) -> None:
        self.kernel, self.calls = kernel, 0

    def __getattr__(self, name):
        attr = getattr(self.kernel, name)
        if not name.startswith("dequant"):
            return attr

        def counted(*args):
            self.calls += 1
            return attr(*args)
        return counted


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.delenv("INFERLAB_EMULATED_BF16", raising=False)
    monkeypatch.setattr(schemes, "_native_bf16_gemm", lambda forced: not forced)


@pytest.mark.parametrize("fmt,layout", [("int4", "tiles"), ("int4", "chunks"), ("int8", "auto")])
def test_prompt_rows_take_the_gemm_and_equal_the_reference_path(kernel, native_bf16, fmt, layout):
    layer = QuantLinear(_weight(256, 128), None, fmt, 32, int4_layout=layout)
    layer.stream = spy = _Spy(kernel)
    x = torch.randn(40, 128).bfloat16()
    reference = F.linear(x, layer.dequantize().bfloat16())
    token = PROMPT_ROWS.set(True)
    try:
        y = layer(x)
        assert spy.calls == 1 and torch.equal(y, reference)
        alone = [layer(x[i:i + 1]) for i in (0, 17, 39)]  # a prompt's last row after a prefix-cache hit
    finally:
        PROMPT_ROWS.reset(token)
    for row, got in zip((0, 17, 39), alone):
        assert torch.equal(got[0], y[row])
    assert spy.calls == 4


def test_where_the_gemm_is_not_taken(kernel, native_bf16, monkeypatch):
    layer = QuantLinear(_weight(256, 128), None, "int4", 32, int4_layout="tiles")
    layer.stream = spy = _Spy(kernel)
    layer(torch.randn(4, 128).bfloat16())  # a few decode rows: the streaming kernel
    assert spy.calls == 0
    layer(torch.randn(40, 128).bfloat16())  # a big decode batch: the GEMM, as a bf16 Linear's
    assert spy.calls == 1
    layer(torch.randn(40, 128).bfloat16().requires_grad_())  # gradients: not the shared scratch
    head = QuantLinear(_weight(256, 128), None, "int8", 0)
    head.prompt_gemm, head.stream = False, spy  # the lm_head (engine/quant/embeddings.py)
    head(torch.randn(40, 128).bfloat16())
    monkeypatch.setenv("INFERLAB_EMULATED_BF16", "1")  # no native bf16: the kernels
    layer(torch.randn(40, 128).bfloat16())
    assert spy.calls == 1


def test_the_emulated_case_is_decided_from_the_cpu_flags(monkeypatch):
    schemes._native_bf16_gemm.cache_clear()
    monkeypatch.setattr(schemes, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert not schemes._native_bf16_gemm(False)
    schemes._native_bf16_gemm.cache_clear()
    monkeypatch.setattr(schemes, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert schemes._native_bf16_gemm(False) and not schemes._native_bf16_gemm(True)
    schemes._native_bf16_gemm.cache_clear()


def test_the_scratch_is_one_buffer_per_shape_and_thread():
    a = schemes.scratch_weight(96, 64)
    assert schemes.scratch_weight(96, 64) is a and schemes.scratch_weight(64, 96) is not a
    other = []
    t = threading.Thread(target=lambda: other.append(schemes.scratch_weight(96, 64)))
    t.start()
    t.join()
    assert other[0] is not a and other[0].data_ptr() != a.data_ptr()


@pytest.mark.parametrize("native,fmt", [(True, "int4"), (True, "int8"), (False, "int4"), (False, "int8")])
def test_an_engine_answers_the_same_on_a_prefix_cache_hit(tiny_llama, monkeypatch, native, fmt):
    """Both routes (the GEMM with native bf16, else int8 activations), 4 and 8 bits: a prompt's K/V the same
    computed cold or after a prefix-cache hit, so a greedy answer is the same."""
    monkeypatch.delenv("INFERLAB_EMULATED_BF16", raising=False)
    monkeypatch.setattr(schemes, "_native_bf16_gemm", lambda forced: native)
    system = list(range(30, 62))
    prompts = [system + [7, 8, 9], system + [11, 12]]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def make(**kw):
        return LLMEngine(EngineConfig(model=str(tiny_llama), dtype="bfloat16", quant_format=fmt, block_size=4,
                                      num_kv_blocks=64, int8_activations=True, **kw))
    expected = [make(enable_prefix_caching=False).generate([p], greedy)[0].token_ids for p in prompts]
    eng = make()
    layers = [m for m in eng.model.modules() if isinstance(m, QuantLinear) and m.prompt_gemm]
    assert layers and all(m.stream is not None for m in layers) and eng.runner.int8_activations
    got = [eng.generate([p], greedy)[0].token_ids for p in prompts]
    assert eng.stats().num_prefix_cache_hit_tokens == 32
    assert got == expected


@pytest.fixture
def no_native_bf16(monkeypatch):
    monkeypatch.setattr(schemes, "_native_bf16_gemm", lambda forced: False)


@pytest.mark.parametrize("fmt,layout", [("int4", "tiles"), ("int4", "chunks"), ("int8", "auto")])
def test_without_native_bf16_prompt_rows_take_the_int8_activation_kernel(kernel, no_native_bf16, fmt, layout):
    layer = QuantLinear(_weight(256, 128), None, fmt, 32, int4_layout=layout)
    layer.stream = spy = _Spy(kernel)
    x = torch.randn(40, 128).bfloat16()
    if fmt == "int8":
        want8 = kernel.stream_linear_int8_q8(x, layer.qweight, layer.scales)
        exact = torch._weight_int8pack_mm(x, layer.qweight, layer.scales)
    else:
        q8 = kernel.stream_linear_int4_tiles_q8 if layout == "tiles" else kernel.stream_linear_int4_q8
        plain = kernel.stream_linear_int4_tiles if layout == "tiles" else kernel.stream_linear_int4
        want8 = q8(x, layer.codes, layer.scale_zero, 32)
        exact = plain(x, layer.codes, layer.scale_zero, 32, None)
    tokens = PROMPT_ROWS.set(True), INT8_ROWS.set(True)
    try:
        y = layer(x)
        alone = [layer(x[i:i + 1]) for i in (0, 17, 39)]
    finally:
        PROMPT_ROWS.reset(tokens[0])
        INT8_ROWS.reset(tokens[1])
    assert spy.calls == 0 and torch.equal(y, want8)
    for row, got in zip((0, 17, 39), alone):
        assert torch.equal(got[0], y[row])
    token = PROMPT_ROWS.set(True)  # int8_activations off: the exact kernel (8 bits: torch's)
    try:
        assert torch.equal(layer(x), exact)
    finally:
        PROMPT_ROWS.reset(token)
    reference = F.linear(x.float(), layer.dequantize()).bfloat16()
    assert (y.float() - reference.float()).abs().max() <= 0.05 * reference.float().abs().max()


def test_the_engine_line_names_the_route_of_quantized_weights(tiny_llama, monkeypatch):
    """At 4 and 8 bits the engine line says what the prompt rows run through (and follows a requantization);
    at 16 bits, and in the app's short line, it says nothing of them."""
    monkeypatch.setattr(schemes, "_native_bf16_gemm", lambda forced: False)
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="bfloat16", quant_format="int4", num_kv_blocks=16,
                                 block_size=4, int8_activations=False))
    assert eng.compute_line().endswith("; int4 prompt rows: weight-streaming kernels (no native bf16; "
                                       "int8_activations off)")
    assert "prompt rows" not in eng.compute_line(short=True)
    eng.set_quantization("bf16")
    eng.generate([[5, 6, 7]], SamplingParams(max_tokens=1))  # the swap lands at the top of a step
    assert "prompt rows" not in eng.compute_line()
    monkeypatch.setattr(schemes, "_native_bf16_gemm", lambda forced: True)
    eng.set_quantization("int8")
    eng.generate([[5, 6, 7]], SamplingParams(max_tokens=1))
    assert eng.compute_line().endswith("; int8 prompt rows: dequantize + library GEMM (native bf16)")


def test_the_bench_json_names_the_route(monkeypatch):
    monkeypatch.setattr(schemes, "_native_bf16_gemm", lambda forced: not forced)
    monkeypatch.delenv("INFERLAB_EMULATED_BF16", raising=False)
    assert schemes.prompt_rows_in_words().startswith("dequantize + library GEMM")
    monkeypatch.setenv("INFERLAB_EMULATED_BF16", "1")
    assert schemes.prompt_rows_in_words().startswith("int8-activation kernels")
    assert schemes.prompt_rows_in_words(False).startswith("weight-streaming kernels")


def test_int8_prompt_rows_keep_the_chunk_body_within_its_groups(kernel, no_native_bf16):
    """The chunk layout's int8-activation body takes groups up to 128: a layer with larger groups keeps the
    exact kernel for its prompt rows rather than failing."""
    layer = QuantLinear(_weight(64, 512), None, "int4", 256, int4_layout="chunks")
    layer.stream = kernel
    x = torch.randn(20, 512).bfloat16()
    tokens = PROMPT_ROWS.set(True), INT8_ROWS.set(True)
    try:
        y = layer(x)
    finally:
        PROMPT_ROWS.reset(tokens[0])
        INT8_ROWS.reset(tokens[1])
    assert torch.equal(y, kernel.stream_linear_int4(x, layer.codes, layer.scale_zero, 256, None))
    with pytest.raises(RuntimeError, match="groups of 32 to 128"):
        kernel.stream_linear_int4_q8(x, layer.codes, layer.scale_zero, 256)
