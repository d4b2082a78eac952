"""SwiGLU, silu(gate) * up, in one kernel over the gate/up projection's output (gate and up side by side),
rounded as the torch layer rounds: silu's result to the activations' dtype, then the product."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gpu.launches import launch
from engine.kernels.gpu.rounding import rounded

BLOCK = 1024


@triton.jit
def _silu_and_mul(gu_ptr, out_ptr, stride_gu, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n_cols
    gate = tl.load(gu_ptr + row * stride_gu + cols, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gu + n_cols + cols, mask=valid, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    silu = rounded(gate / (1.0 + tl.exp(-gate)), dt)
    tl.store(out_ptr + row * stride_o + cols, rounded(silu * up, dt).to(dt), mask=valid)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (n, 2 * inter) -> (n, inter)."""
    n, width = gate_up.shape
    inter = width // 2
    out = torch.empty((n, inter), dtype=gate_up.dtype, device=gate_up.device)
    launch(_silu_and_mul, (n, triton.cdiv(inter, BLOCK)), "silu_and_mul", gate_up, out, gate_up.stride(0),
           out.stride(0), inter, BLOCK=BLOCK)
    return out
