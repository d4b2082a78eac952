"""How each quantized weight format is stored, multiplied and handed to the fused step: one class per
format of engine/quant_formats.py, keyed by its name (`SCHEMES`). QuantLinear (weight_only.py) holds
the parts every format shares (outlier columns, bias, reference mode) and asks its scheme for the rest,
so a new format is one class here plus one row in quant_formats.py.

    int8: w ≈ scale * q               one scale per output row, q in [-127, 127]
    fp8-e4m3: w ≈ scale * q           one scale per output row, q an e4m3 value (engine/quant/fp8.py)
    int4: w ≈ (q - 8) * scale + zero  one (scale, zero) per group of input columns, q in [0, 15]

Each method takes the layer (its buffers are registered on it, so .to(), state_dict and the huge-page
move see them).
"""
from __future__ import annotations

import threading
from functools import lru_cache

import torch
import torch.nn.functional as F

from engine.kernels import cpu_flags
from engine.models.layers.linear import INT8_ROWS, few_rows
from engine.quant import int4_torch
from engine.quant.embeddings import int8_rows
from engine.quant.fp8 import Fp8Rows
from engine.runner.cpu_compute import emulated_bf16_forced, native_bf16_flags


@torch.library.custom_op("inferlab::stream_linear_int4", mutates_args=())
def stream_linear_int4(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor,
                       group_size: int) -> torch.Tensor:
    """The native int4 kernel as an op a compiled region calls without a graph break."""
    from engine.kernels import stream_linear_kernel

    return stream_linear_kernel().stream_linear_int4(x, codes, scale_zero, group_size, None)


@stream_linear_int4.register_fake
def _(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], codes.shape[0])


@torch.library.custom_op("inferlab::stream_linear_int4_tiles", mutates_args=())
def stream_linear_int4_tiles(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor,
                             group_size: int) -> torch.Tensor:
    """The native int4 kernel of the tiles layout as an op a compiled region calls without a graph break."""
    from engine.kernels import stream_linear_kernel

    return stream_linear_kernel().stream_linear_int4_tiles(x, codes, scale_zero, group_size, None)


@stream_linear_int4_tiles.register_fake
def _(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], codes.shape[0])


@torch.library.custom_op("inferlab::stream_linear_int8", mutates_args=())
def stream_linear_int8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The native int8 row kernel as an op a compiled region calls without a graph break."""
    from engine.kernels import stream_linear_kernel

    return stream_linear_kernel().stream_linear_int8(x, qweight, scales, None)


@stream_linear_int8.register_fake
def _(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], qweight.shape[0])


def pack_int4_chunks(q: torch.Tensor) -> torch.Tensor:
    """4-bit codes (out, in), values 0..15 -> (out, in / 2) uint8 in the kernel's layout: per chunk of
    32 columns, byte j holds column j (low nibble) and column j + 16 (high nibble)."""
    n, k = q.shape
    chunks = q.to(torch.uint8).reshape(n, k // 32, 2, 16)
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4_chunks(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4_chunks: (out, in / 2) uint8 -> (out, in) int64 codes."""
    n, half = codes.shape
    c = codes.reshape(n, half // 16, 1, 16).long()
    return torch.cat([c & 0xF, c >> 4], dim=2).reshape(n, 2 * half)


# The tiles layout (engine/kernels/core/linear_tiles.h): 16 output rows a tile, each vector lane of the
# product one row. Its codes and (scale, zero) pairs keep the chunk layout's shapes, reordered.
TILE_ROWS = 16


def pack_int4_tiles(q: torch.Tensor, group: int) -> torch.Tensor:
    """4-bit codes (out, in), values 0..15, out a multiple of 16 -> (out, in / 2) uint8 in the tiles layout:
    per tile of 16 rows, per group, per 8 columns: 64 bytes, byte 4j + i holding row j's column i (low
    nibble) and column 4 + i (high)."""
    n, k = q.shape
    t = q.to(torch.uint8).reshape(n // TILE_ROWS, TILE_ROWS, k // group, group // 8, 2, 4)
    t = t.permute(0, 2, 3, 1, 5, 4)  # (tile, group, step, row, i, half)
    return (t[..., 0] | (t[..., 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4_tiles(codes: torch.Tensor, group: int) -> torch.Tensor:
    """The inverse of pack_int4_tiles: (out, in / 2) uint8 -> (out, in) int64 codes."""
    n, half = codes.shape
    k = 2 * half
    c = codes.reshape(n // TILE_ROWS, k // group, group // 8, TILE_ROWS, 4).long()
    t = torch.stack([c & 0xF, c >> 4], dim=-1)  # (tile, group, step, row, i, half)
    return t.permute(0, 3, 1, 2, 5, 4).reshape(n, k)


def tile_scale_zero(sz: torch.Tensor) -> torch.Tensor:
    """(out, groups, 2) pairs -> the same shape in the tiles layout: per tile and group, 16 scales then 16
    zeros."""
    n, g, _ = sz.shape
    return sz.reshape(n // TILE_ROWS, TILE_ROWS, g, 2).permute(0, 2, 3, 1).reshape(n, g, 2).contiguous()


def untile_scale_zero(sz: torch.Tensor) -> torch.Tensor:
    """The inverse of tile_scale_zero."""
    n, g, _ = sz.shape
    return sz.reshape(n // TILE_ROWS, g, 2, TILE_ROWS).permute(0, 3, 1, 2).reshape(n, g, 2)


def tiles_fit(out_features: int, in_features: int, group: int) -> bool:
    """Whether a layer can take the tiles layout: whole tiles, and whole pairs of them so that a merged
    gate_up's halves start on a tile (the fused step splits it there)."""
    return out_features % (2 * TILE_ROWS) == 0 and in_features % 64 == 0 and group % 32 == 0


INT4_LAYOUT_ENV = "INFERLAB_INT4_LAYOUT"  # tiles | chunks: force the default layout (side-by-side benches)
TILES_TIERS = ("avx512", "avx2")  # where its bodies measured faster (scripts/int4_layout_bench.py); NEON unmeasured


def tiles_by_default() -> bool:
    """Whether "auto" picks the tiles layout on the CPU: where the kernels run the avx512 or the avx2 tier
    (on a Sapphire Rapids Xeon one 4-bit stream ran 1.39x and 1.24x as fast as in the chunk layout on
    them); not on NEON, whose tiles body is the plain C++ one (no Arm machine to measure one on), nor
    portable. INFERLAB_INT4_LAYOUT=tiles|chunks overrides it."""
    import os

    from engine.kernels import cpu_tier

    forced = os.environ.get(INT4_LAYOUT_ENV, "").strip().lower()
    if forced in ("tiles", "chunks"):
        return forced == "tiles"
    if forced:
        import warnings

        warnings.warn(f"{INT4_LAYOUT_ENV}={forced!r}: tiles or chunks; the tier's default is used", stacklevel=2)
    return cpu_tier("int4") in TILES_TIERS


def int4_layout_in_words() -> str:
    """The layout 4-bit layers take on this CPU by default, for the bench JSON."""
    if tiles_by_default():
        return "tiles (16 output rows a tile, one vector lane per row)"
    return "chunks (one output row at a time)"


# Many rows (prompt rows, or a decode batch past the few-row kernels: linear.few_rows) on a CPU that multiplies
# bf16 natively (AMX, AVX512-BF16, Arm BF16: engine/runner/cpu_compute.py) take the library GEMM over the
# layer's weight dequantized into a per-thread scratch buffer by the native kernel (core/dequant.h: bit for
# bit the reference's bf16 weight), as a bf16 Linear's prompt rows do. One gate_up matrix of SmolLM2 (3072 x
# 576, groups of 32) on a Sapphire Rapids Xeon (AMX), 1 thread: the int4 tiles kernel 2.8 ms at 64 rows and
# 21.6 ms at 512; dequantizing 0.23 ms, the GEMM 0.52 and 1.60 ms. int8 (torch's _weight_int8pack_mm): 2.8 and
# 22.1 ms; dequantizing 0.23 ms. Not for the head (`layer.prompt_gemm` False: its prompt-step calls carry one
# row per sequence, where writing its whole weight would cost more than the product), nor where x needs
# gradients (the scratch is overwritten by the next layer), nor inside a compiled region.
_SCRATCH = threading.local()


@lru_cache(maxsize=4)
def _native_bf16_gemm(forced: bool) -> bool:
    return bool(native_bf16_flags(cpu_flags())) and not forced


def gemm_for_many_rows(layer, x2: torch.Tensor) -> bool:
    """Whether these rows take the dequantize-then-GEMM route (see above)."""
    return (not torch.compiler.is_compiling() and layer.prompt_gemm and layer.stream is not None
            and x2.device.type == "cpu" and not x2.requires_grad and not few_rows(x2)
            and _native_bf16_gemm(emulated_bf16_forced()))


def int8_many_rows(layer, x2: torch.Tensor) -> bool:
    """Where the GEMM route does not apply: whether a 4- or 8-bit layer's many rows take its int8-activation
    kernel (EngineConfig.int8_activations, linear.INT8_ROWS; x rounded to int8 per 32 columns, as llama.cpp's
    CPU prefill does and as the fused step's decode rows are). Each row's result is its own there too.
    Measured on one gate_up matrix (3072 x 576), 1 thread, the AVX2 body (on the Xeon, no AVX-512): int4 g32,
    64 rows 4.24 ms with float activations, 2.40 with int8; 512 rows 34.7 and 21.2 ms; int8, 64 rows 4.23 ms
    in torch's _weight_int8pack_mm, 2.95 ms with int8 activations."""
    # is_compiling first: a compiled region must not trace the ContextVar (dynamo cannot)
    return (not torch.compiler.is_compiling() and layer.prompt_gemm and layer.stream is not None
            and x2.device.type == "cpu" and not few_rows(x2) and INT8_ROWS.get() and not x2.requires_grad)


def prompt_rows_in_words(int8_activations: bool = True) -> str:
    """What a quantized layer's many rows (prompt rows) run through on this CPU, for the bench JSON."""
    if _native_bf16_gemm(emulated_bf16_forced()):
        return "dequantize + library GEMM (native bf16)"
    if int8_activations:
        return "int8-activation kernels (no native bf16; int8_activations on)"
    return "weight-streaming kernels (no native bf16; int8_activations off)"


def scratch_weight(rows: int, cols: int) -> torch.Tensor:
    """This thread's bf16 (rows, cols) buffer for a dequantized weight, reused by every layer of that shape."""
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    out = buffers.get((rows, cols))
    if out is None:
        out = buffers[(rows, cols)] = torch.empty(rows, cols, dtype=torch.bfloat16)
    return out


def _int8_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `_weight_int8pack_mm` runs on `device` for `dtype` activations (one tiny product)."""
    try:
        x = torch.zeros(1, 32, dtype=dtype, device=device)
        torch._weight_int8pack_mm(x, torch.zeros(8, 32, dtype=torch.int8, device=device),
                                  torch.ones(8, dtype=dtype, device=device))
    except (RuntimeError, NotImplementedError):
        return False
    return True


class Int8Rows:
    """int8 codes (out, in) + one scale per row (`qweight`, `scales`)."""
    name = "int8"
    kernel_kind = 1  # the fused step's Proj kind (engine/kernels/fused_decode.cpp)

    @staticmethod
    def quantize(layer, w: torch.Tensor) -> None:
        q, scale = int8_rows(w, layer.dtype)  # one scale per output row
        layer.register_buffer("qweight", q)
        layer.register_buffer("scales", scale)
        # torch's fused int8 kernel where this torch build has it for the device (older CUDA builds lack it)
        layer.int8_fused = w.device.type == "cuda" and _int8_mm_runs(w.device, layer.dtype)

    @staticmethod
    def dequantize(layer) -> torch.Tensor:
        return layer.qweight.float() * layer.scales.float()[:, None]

    @staticmethod
    def fast_ok(layer, x: torch.Tensor) -> bool:
        if x.device.type == "cuda":
            return x.dtype in (torch.bfloat16, torch.float16)
        return x.device.type == "cpu" and x.dtype == torch.bfloat16

    @staticmethod
    def matmul(layer, x2: torch.Tensor) -> torch.Tensor:
        """x2 (rows, in) -> (rows, out), without outliers and bias."""
        few = few_rows(x2)  # a few decode rows (prompt rows take the many-row kernel: linear.PROMPT_ROWS)
        same = layer.scales.dtype == x2.dtype
        if layer.int8_fused and few and same:
            return torch._weight_int8pack_mm(x2, layer.qweight, layer.scales)  # fused: the weight read once
        if same and gemm_for_many_rows(layer, x2):
            w = layer.stream.dequant_int8(layer.qweight, layer.scales, scratch_weight(*layer.qweight.shape))
            return F.linear(x2, w)
        if same and int8_many_rows(layer, x2):
            return layer.stream.stream_linear_int8_q8(x2, layer.qweight, layer.scales)
        if x2.device.type == "cuda":  # many rows: one 16-bit cast per call, then a GEMM
            return F.linear(x2, layer.qweight.to(x2.dtype)) * layer.scales.to(x2.dtype)
        if layer.stream is not None and few and same:
            if torch.compiler.is_compiling():
                return stream_linear_int8(x2, layer.qweight, layer.scales)
            return layer.stream.stream_linear_int8(x2, layer.qweight, layer.scales, None)
        return torch._weight_int8pack_mm(x2, layer.qweight, layer.scales)  # more rows: reused weight rows

    @staticmethod
    def kernel_operands(layer) -> tuple | str:
        if layer.scales.dtype != torch.bfloat16:
            return "int8 scales not in bf16"
        return (Int8Rows.kernel_kind, layer.qweight, layer.scales, 0)


class Int4Groups:
    """int4 codes, two per byte (`codes`) + (scale, zero) per group (`scale_zero`, (out, groups, 2)), in the
    native kernel's chunk layout or, where the avx512 / avx2 tiers run, its tiles layout (`layer.int4_tiles`);
    or, where torch's int4 matmul applies, its packed layout (`packed`, `szt`) instead: one layout per
    layer, chosen when it is built (`int4_layout`: "auto", or "chunks", "tiles", "torch" to force one)."""
    name = "int4"
    kernel_kind = 2
    tiles_kind = 3  # the fused step's Proj kind for the tiles layout

    @staticmethod
    def quantize(layer, w: torch.Tensor) -> None:
        g = layer.group_size
        if layer.in_features % g:
            raise ValueError(f"in_features {layer.in_features} is not a multiple of the group size {g}")
        wg = w.reshape(layer.out_features, -1, g)
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = (hi - lo).clamp(min=1e-8) / 15.0
        zero = lo + 8 * scale  # so that w = (q - 8) * scale + zero
        q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(layer.out_features, -1)
        # (out, groups, 2) scale-and-zero per group: what the native kernel reads next to each row
        scale_zero = torch.cat([scale, zero], dim=-1).to(layer.dtype).contiguous()
        if Int4Groups._torch_layout(layer, w.device):  # the (groups, out, 2) pairs and packing, made once
            packed = int4_torch.checked_pack(q, scale_zero, g)
            if packed is not None:
                layer.register_buffer("szt", packed[1])
                layer.register_buffer("packed", packed[0])
                return
        # two 4-bit codes per byte, the one copy both the kernel and the dequantize path read
        layer.int4_tiles = Int4Groups._tiles(layer, w.device)
        if layer.int4_tiles:
            layer.register_buffer("scale_zero", tile_scale_zero(scale_zero))
            layer.register_buffer("codes", pack_int4_tiles(q, g))
        else:
            layer.register_buffer("scale_zero", scale_zero)
            layer.register_buffer("codes", pack_int4_chunks(q))

    @staticmethod
    def _tiles(layer, device: torch.device) -> bool:
        """The tiles layout where it is forced, or by default on the CPU where it fits and tiles_by_default()
        says so (the tier's bodies read it faster); never for the reference (it keeps the readable one)."""
        fits = tiles_fit(layer.out_features, layer.in_features, layer.group_size)
        if layer.int4_layout == "tiles":
            if not fits:
                raise ValueError(f"the int4 tiles layout takes out_features a multiple of 32, in_features of 64 "
                                 f"and groups of 32 or more; got {layer.out_features} x {layer.in_features}, "
                                 f"group {layer.group_size}")
            return True
        if layer.int4_layout != "auto" or layer.reference or device.type != "cpu" or not fits:
            return False
        return tiles_by_default()

    @staticmethod
    def _torch_layout(layer, device: torch.device) -> bool:
        wanted = layer.int4_layout == "torch" or (layer.int4_layout == "auto" and device.type == "cuda")
        return (wanted and not layer.reference
                and int4_torch.applies(device, layer.dtype, layer.out_features, layer.in_features, layer.group_size))

    @staticmethod
    def dequantize(layer) -> torch.Tensor:
        if layer.packed is not None:
            return int4_torch.dequantize(layer.packed, layer.group_size, layer.szt, layer.in_features)
        if layer.int4_tiles:
            q, sz = unpack_int4_tiles(layer.codes, layer.group_size), untile_scale_zero(layer.scale_zero).float()
        else:
            q, sz = unpack_int4_chunks(layer.codes), layer.scale_zero.float()  # (out, groups, 2)
        q = q.float().reshape(layer.out_features, -1, layer.group_size)
        return ((q - 8) * sz[..., :1] + sz[..., 1:]).reshape(layer.out_features, layer.in_features)

    @staticmethod
    def fast_ok(layer, x: torch.Tensor) -> bool:
        if layer.packed is not None:  # torch's int4 matmul takes bf16 activations
            return x.dtype == torch.bfloat16
        if x.device.type != "cpu" or x.dtype != torch.bfloat16:  # not packed for torch: no CUDA kernel
            return False
        return layer.stream is not None and layer.in_features % 64 == 0

    @staticmethod
    def matmul(layer, x2: torch.Tensor) -> torch.Tensor:
        if layer.packed is not None:
            return int4_torch.matmul(x2, layer.packed, layer.group_size, layer.szt)
        if gemm_for_many_rows(layer, x2):
            dequant = layer.stream.dequant_int4_tiles if layer.int4_tiles else layer.stream.dequant_int4
            w = dequant(layer.codes, layer.scale_zero, layer.group_size,
                        scratch_weight(layer.out_features, layer.in_features))
            return F.linear(x2, w)
        if int8_many_rows(layer, x2) and (layer.int4_tiles or layer.group_size <= 128):  # (the chunk body's groups)
            if layer.int4_tiles:
                return layer.stream.stream_linear_int4_tiles_q8(x2, layer.codes, layer.scale_zero, layer.group_size)
            return layer.stream.stream_linear_int4_q8(x2, layer.codes, layer.scale_zero, layer.group_size)
        if layer.int4_tiles:
            if torch.compiler.is_compiling():
                return stream_linear_int4_tiles(x2, layer.codes, layer.scale_zero, layer.group_size)
            return layer.stream.stream_linear_int4_tiles(x2, layer.codes, layer.scale_zero, layer.group_size, None)
        if torch.compiler.is_compiling():
            return stream_linear_int4(x2, layer.codes, layer.scale_zero, layer.group_size)
        return layer.stream.stream_linear_int4(x2, layer.codes, layer.scale_zero, layer.group_size, None)

    @staticmethod
    def kernel_operands(layer) -> tuple | str:
        if layer.packed is not None:
            return "int4 in torch's packed layout"
        if layer.in_features % 64:
            return "an int4 layer whose in_features is not a multiple of 64"
        kind = Int4Groups.tiles_kind if layer.int4_tiles else Int4Groups.kernel_kind
        return (kind, layer.codes, layer.scale_zero, layer.group_size)


SCHEMES = {scheme.name: scheme for scheme in (Int8Rows, Fp8Rows, Int4Groups)}
