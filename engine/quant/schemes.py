"""How each quantized weight format is stored, multiplied and handed to the fused step: one class per
format of engine/quant_formats.py, keyed by its name (`SCHEMES`). QuantLinear (weight_only.py) holds
the parts every format shares (outlier columns, bias, reference mode) and asks its scheme for the rest,
so a new format is one class here plus one row in quant_formats.py.

    int8: w ≈ scale * q               one scale per output row, q in [-127, 127]
    int4: w ≈ (q - 8) * scale + zero  one (scale, zero) per group of input columns, q in [0, 15]

Each method takes the layer (its buffers are registered on it, so .to(), state_dict and the huge-page
move see them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models.layers.linear import few_rows
from engine.quant import int4_torch
from engine.quant.embeddings import int8_rows


@torch.library.custom_op("inferlab::stream_linear_int4", mutates_args=())
def stream_linear_int4(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor,
                       group_size: int) -> torch.Tensor:
    """The native int4 kernel as an op a compiled region calls without a graph break."""
    from engine.kernels import stream_linear_kernel

    return stream_linear_kernel().stream_linear_int4(x, codes, scale_zero, group_size, None)


@stream_linear_int4.register_fake
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
    """int4 codes, two per byte in the native kernel's chunk layout (`codes`) + (scale, zero) per group
    (`scale_zero`, (out, groups, 2)); or, where torch's int4 matmul applies, its packed layout
    (`packed`, `szt`) instead: one layout per layer."""
    name = "int4"
    kernel_kind = 2

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
        layer.register_buffer("scale_zero", scale_zero)
        # two 4-bit codes per byte, the one copy both the kernel and the dequantize path read
        layer.register_buffer("codes", pack_int4_chunks(q))

    @staticmethod
    def _torch_layout(layer, device: torch.device) -> bool:
        wanted = layer.int4_layout == "torch" or (layer.int4_layout == "auto" and device.type == "cuda")
        return (wanted and not layer.reference
                and int4_torch.applies(device, layer.dtype, layer.out_features, layer.in_features, layer.group_size))

    @staticmethod
    def dequantize(layer) -> torch.Tensor:
        if layer.packed is not None:
            return int4_torch.dequantize(layer.packed, layer.group_size, layer.szt, layer.in_features)
        q = unpack_int4_chunks(layer.codes)
        sz = layer.scale_zero.float()  # (out, groups, 2)
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
        if torch.compiler.is_compiling():
            return stream_linear_int4(x2, layer.codes, layer.scale_zero, layer.group_size)
        return layer.stream.stream_linear_int4(x2, layer.codes, layer.scale_zero, layer.group_size, None)

    @staticmethod
    def kernel_operands(layer) -> tuple | str:
        if layer.packed is not None:
            return "int4 in torch's packed layout"
        if layer.in_features % 64:
            return "an int4 layer whose in_features is not a multiple of 64"
        return (Int4Groups.kernel_kind, layer.codes, layer.scale_zero, layer.group_size)


SCHEMES = {scheme.name: scheme for scheme in (Int8Rows, Int4Groups)}
