"""Weight-only fp8 e4m3 with one scale per output row: the "fp8-e4m3" format of engine/quant_formats.py.

    w ≈ scale * q    q = w / scale rounded to the nearest e4m3 value (torch.float8_e4m3fn), scale = row max / 448

The same byte per weight as int8, spent differently: int8 has 255 evenly spaced steps across a row's range,
e4m3 has 3 mantissa bits and 4 exponent bits, so its steps are fine near zero and coarse near the row's
largest weights (relative error ~1/16 everywhere rather than ~1/254 of the row's max). The held-out
perplexity, KL and top-1 agreement against bf16 say which of the two keeps the model closer (the tradeoff
sweep and `inferlab bench quant` measure them side by side).

How it multiplies: dequantize-then-GEMM on every device. The codes are cast to the activations' dtype (fp8 ->
bf16 is exact: e4m3's values are all bf16 values), multiplied by the library GEMM, and the row scales applied
to the product's columns. No native kernel reads fp8 here, so a CPU decode step writes and reads a 16-bit copy
of each weight: it saves memory and costs time (decode 14-17x slower than bf16 on a 2-core Zen 4:
docs/measurements/kernels.md). GPUs with fp8 tensor cores
(compute capability 8.9+) would multiply the codes directly (`torch._scaled_mm` with fp8 activations); that
path is not built.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# every e4m3 byte's bf16 bit pattern: on the CPU a table lookup (numpy's gather of uint8 indices) widens the codes
# 2.9x as fast as torch's element-by-element cast (a 1536 x 576 matrix, 1 thread, Zen 4: 2.4 vs 7.0 ms), the
# same bits (tests/test_quant.py)
_BF16_OF_BYTE = torch.arange(256, dtype=torch.uint8).view(FP8).to(torch.bfloat16).view(torch.int16).numpy()


def widen(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 e4m3 codes as `dtype` (exact for bf16, float16 and float32: every e4m3 value is one of theirs)."""
    if q.device.type != "cpu":
        return q.to(dtype)
    bf16 = torch.from_numpy(_BF16_OF_BYTE[q.view(torch.uint8).numpy()]).view(torch.bfloat16)
    return bf16 if dtype == torch.bfloat16 else bf16.to(dtype)


def fp8_rows(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q fp8 e4m3 (rows, cols), scale (rows,) in `dtype`) with w ≈ scale[:, None] * q. The scale is rounded
    to `dtype` first and the codes made against the rounded scale, so dequantizing with it is what was
    quantized."""
    w = w.float()
    scale = (w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX).to(dtype)
    q = (w / scale.float()[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


class Fp8Rows:
    """fp8 e4m3 codes (out, in) in `qweight` + one scale per row in `scales` (QuantLinear's buffers; `layer` is
    the QuantLinear, typed Any: its buffers are registered at run time)."""
    name = "fp8-e4m3"

    @staticmethod
    def quantize(layer: Any, w: torch.Tensor) -> None:
        q, scale = fp8_rows(w, layer.dtype)
        layer.register_buffer("qweight", q)
        layer.register_buffer("scales", scale)

    @staticmethod
    def dequantize(layer: Any) -> torch.Tensor:
        return layer.qweight.float() * layer.scales.float()[:, None]

    @staticmethod
    def fast_ok(layer: Any, x: torch.Tensor) -> bool:
        return x.dtype in (torch.bfloat16, torch.float16, torch.float32)

    @staticmethod
    def matmul(layer: Any, x2: torch.Tensor) -> torch.Tensor:
        """x2 (rows, in) -> (rows, out), without outliers and bias: the codes cast to x2's dtype (exact), one
        GEMM, the row scales on the product's columns."""
        return F.linear(x2, widen(layer.qweight, x2.dtype)) * layer.scales.to(x2.dtype)

    @staticmethod
    def kernel_operands(layer: Any) -> tuple[Any, ...] | str:
        return "fp8 weights (no native fp8 kernel: the layer-by-layer path multiplies them)"
