"""The int4 tiles layout (engine/kernels/core/linear_tiles.h, engine/quant/schemes.py): 16 output rows a
tile, one vector lane per row. Packing, the layout each layer takes, both products on every tier this
machine runs against the dequantized reference and against the chunk layout's, and the fused step in
both layouts (whatever layout "auto" picks on the machine the tests run on)."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import fused_decode_kernel, stream_linear_kernel
from engine.quant import schemes
from engine.quant.schemes import pack_int4_tiles, tile_scale_zero, tiles_fit, unpack_int4_tiles, untile_scale_zero
from engine.quant.weight_only import QuantLinear
from tests.conftest import built_kernel, kernel_tiers
from tests.test_fused_decode import _compare_every_fused_step, _engine, same_pick, tiny  # noqa: F401 (tiny: a fixture)


@pytest.fixture(scope="module", params=kernel_tiers())
def kernel(request):
    return built_kernel(stream_linear_kernel, request.param)


def test_packing_round_trips_and_keeps_the_shapes():
    torch.manual_seed(0)
    for n, k, g in [(16, 64, 32), (48, 576, 32), (32, 256, 128), (64, 320, 64)]:
        q = torch.randint(0, 16, (n, k))
        codes = pack_int4_tiles(q, g)
        assert codes.shape == (n, k // 2) and codes.dtype == torch.uint8
        assert torch.equal(unpack_int4_tiles(codes, g), q)
        sz = torch.randn(n, k // g, 2)
        tiled = tile_scale_zero(sz)
        assert tiled.shape == sz.shape and torch.equal(untile_scale_zero(tiled), sz)
    # the layout itself: tile 0, group 0, step 0, byte 4j + i = row j's column i (low) and 4 + i (high)
    q = torch.arange(16 * 32).reshape(16, 32) % 16
    codes = pack_int4_tiles(q, 32)
    for j in range(16):
        for i in range(4):
            b = int(codes.flatten()[4 * j + i])
            assert (b & 0xF, b >> 4) == (int(q[j, i]), int(q[j, 4 + i]))
    sz = torch.arange(32 * 2, dtype=torch.float32).reshape(32, 1, 2)
    first = tile_scale_zero(sz).flatten()[:32].tolist()  # tile 0, group 0: 16 scales, then 16 zeros
    assert first == [2.0 * j for j in range(16)] + [2.0 * j + 1 for j in range(16)]


def test_which_layers_take_the_tiles_layout(monkeypatch):
    w = torch.randn(64, 128).bfloat16()
    monkeypatch.setattr(schemes, "tiles_by_default", lambda: True)
    assert QuantLinear(w, None, "int4", 32).int4_tiles
    assert not QuantLinear(w, None, "int4", 32, reference=True).int4_tiles  # the reference keeps the readable one
    assert not QuantLinear(w, None, "int4", 32, int4_layout="chunks").int4_tiles
    assert not QuantLinear(torch.randn(48, 128).bfloat16(), None, "int4", 32).int4_tiles  # not whole pairs of tiles
    assert not QuantLinear(w, None, "int8", 32).int4_tiles  # int8 rows have one layout
    monkeypatch.setattr(schemes, "tiles_by_default", lambda: False)
    assert not QuantLinear(w, None, "int4", 32).int4_tiles
    assert QuantLinear(w, None, "int4", 32, int4_layout="tiles").int4_tiles  # forced
    with pytest.raises(ValueError, match="tiles layout takes"):
        QuantLinear(torch.randn(40, 128).bfloat16(), None, "int4", 32, int4_layout="tiles")
    with pytest.raises(ValueError, match="int4_layout"):
        QuantLinear(w, None, "int4", 32, int4_layout="rows")
    assert tiles_fit(4096, 4096, 128) and not tiles_fit(4096, 4096, 16) and not tiles_fit(4096, 100, 32)


def test_the_default_layout_follows_the_tier_or_the_environment(monkeypatch):
    import engine.kernels

    monkeypatch.delenv(schemes.INT4_LAYOUT_ENV, raising=False)
    for tier, tiles in (("avx512", True), ("avx2", True), ("neon", False), ("portable", False)):
        # the int4 family's tier (the measured choice may differ per family: engine/kernels/tiers.py)
        monkeypatch.setattr(engine.kernels, "cpu_tier", lambda family=None, tier=tier: tier)
        assert schemes.tiles_by_default() == tiles
        assert schemes.int4_layout_in_words().startswith("tiles" if tiles else "chunks")
    monkeypatch.setenv(schemes.INT4_LAYOUT_ENV, "tiles")
    assert schemes.tiles_by_default()  # forced on a tier that defaults to chunks (portable, the last above)
    monkeypatch.setattr(engine.kernels, "cpu_tier", lambda family=None: "avx512")
    monkeypatch.setenv(schemes.INT4_LAYOUT_ENV, "chunks")
    assert not schemes.tiles_by_default()
    monkeypatch.setenv(schemes.INT4_LAYOUT_ENV, "rows")
    with pytest.warns(UserWarning, match="tiles or chunks"):
        assert schemes.tiles_by_default()  # a value it does not know: the tier's default, with a warning


@pytest.mark.parametrize("n,k,g", [(64, 576, 32), (32, 256, 128), (96, 320, 64)])
def test_both_products_on_every_tier(kernel, n, k, g):
    """Float activations: the exact sums, as the chunk layout's within a bf16 rounding; int8 activations:
    as the chunk layout's int8 body; each row of x its own result (bit for bit alone or together), and a
    bias added before rounding."""
    torch.manual_seed(1)
    w = (torch.randn(n, k) * 0.05).bfloat16()
    tiles = QuantLinear(w, None, "int4", g, int4_layout="tiles")
    chunks = QuantLinear(w, None, "int4", g, int4_layout="chunks")
    assert torch.equal(tiles.dequantize(), chunks.dequantize())
    bias = torch.randn(n).bfloat16()
    for m in (1, 2, 3, 4, 5, 9):
        x = torch.randn(m, k).bfloat16()
        ref = x.float() @ chunks.dequantize().t()
        y = kernel.stream_linear_int4_tiles(x, tiles.codes, tiles.scale_zero, g, None).float()
        yc = kernel.stream_linear_int4(x, chunks.codes, chunks.scale_zero, g, None).float()
        assert (y - ref).abs().max() <= 0.01 * ref.abs().max() + 1e-3
        assert (y - yc).abs().max() <= 0.01 * ref.abs().max() + 1e-3
        yb = kernel.stream_linear_int4_tiles(x, tiles.codes, tiles.scale_zero, g, bias).float()
        assert (yb - (ref + bias.float())).abs().max() <= 0.01 * (ref + bias.float()).abs().max() + 1e-3
        q8 = kernel.stream_linear_int4_tiles_q8(x, tiles.codes, tiles.scale_zero, g)
        if g <= 128 and m <= 8:
            q8c = kernel.stream_linear_int4_q8(x, chunks.codes, chunks.scale_zero, g).float()
            assert (q8.float() - q8c).abs().max() <= 0.01 * q8c.abs().max() + 1e-3
        for i in range(m):  # a row alone is the row in company
            alone = kernel.stream_linear_int4_tiles(x[i:i + 1], tiles.codes, tiles.scale_zero, g, None)
            assert torch.equal(alone[0], y[i].bfloat16())
            alone8 = kernel.stream_linear_int4_tiles_q8(x[i:i + 1], tiles.codes, tiles.scale_zero, g)
            assert torch.equal(alone8[0], q8[i])


def test_bad_operands_are_refused(kernel):
    x = torch.randn(2, 128).bfloat16()
    good = QuantLinear(torch.randn(64, 128).bfloat16(), None, "int4", 32, int4_layout="tiles")
    with pytest.raises(RuntimeError, match="multiple of 16"):  # rows not whole tiles
        kernel.stream_linear_int4_tiles(x, good.codes[:40], good.scale_zero[:40], 32, None)
    with pytest.raises(RuntimeError, match="int4 tiles"):  # K does not match the codes
        kernel.stream_linear_int4_tiles_q8(torch.randn(2, 64).bfloat16(), good.codes, good.scale_zero, 32)
    with pytest.raises(RuntimeError, match="bf16"):
        kernel.stream_linear_int4_tiles(x.float(), good.codes, good.scale_zero, 32, None)
    with pytest.raises(RuntimeError, match="int4 tiles"):  # a group the codes were not made with
        kernel.stream_linear_int4_tiles(x, good.codes, good.scale_zero, 48, None)


@pytest.fixture(scope="module", params=kernel_tiers())
def fused_kernel(request):
    return built_kernel(fused_decode_kernel, request.param)


@pytest.mark.slow
@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("q8", [False, True])
def test_the_fused_step_in_either_layout(tiny, fused_kernel, monkeypatch, tiles, q8):  # noqa: F811
    monkeypatch.setattr(schemes, "tiles_by_default", lambda: tiles)
    # the engine's int8_activations as the fused step's: without native bf16 it also rounds the prompt rows
    engine = _engine(tiny, "int4", quant_embeddings=True, int8_activations=q8)
    layers = [m for m in engine.model.modules() if isinstance(m, QuantLinear) and m.format.name == "int4"]
    assert layers and all(m.int4_tiles == tiles for m in layers)
    pairs = _compare_every_fused_step(engine, fused_kernel, int8_activations=q8)
    assert pairs
    agree = sum(same_pick(f, r) for f, r, *_ in pairs) / sum(f.shape[0] for f, *_ in pairs)
    if q8:  # x rounded to int8 (as tests/test_fused_decode.py holds it)
        rel = max(((f - r).norm() / r.norm()).item() for f, r, *_ in pairs)
        assert 0 < rel < 0.3 and agree >= 0.8, (rel, agree)
    else:
        for fused, ref, *_ in pairs:
            # rounding order only: the layer path's products (on a CPU without native bf16, fp32 library
            # GEMMs whose summation order follows the ISA) against the step's; up to 2.4 % of the largest
            # logit (a few bf16 ulps) seen as AVX2 (scripts/as_avx2.sh), 1.9 % on AVX-512
            assert (fused - ref).abs().max().item() <= 0.03 * ref.abs().max().item() + 1e-2
        assert agree >= 0.97
