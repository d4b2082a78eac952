"""Residual add + RMSNorm in one kernel (one program a row).

Rounded as the torch layers round (engine/models/layers/norm.py): the sum x + residual is rounded to the
activations' dtype and kept as the new residual; the row is normalised in float32, rounded, then multiplied
by the weight and rounded again. The mean of squares is summed in float32 in one fixed order per row (the
torch layer sums in float64): each row's result is its own, whatever rows share the batch."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gpu.launches import launch
from engine.kernels.gpu.rounding import rounded


@triton.jit
def _add_rms_norm(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                  HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=valid, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=valid, other=0.0).to(tl.float32)
        x = rounded(x + r, res_out_ptr.dtype.element_ty)  # as torch's add rounds it
        tl.store(res_out_ptr + row * stride_ro + cols, x.to(res_out_ptr.dtype.element_ty), mask=valid)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    dt = out_ptr.dtype.element_ty
    normed = rounded(x * tl.rsqrt(mean_square + eps), dt)
    w = tl.load(w_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, rounded(normed * w, dt).to(dt), mask=valid)


def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (n, hidden) [+ residual] -> (RMSNorm(x + residual) * weight, x + residual): the layer's input and
    the new residual (x itself when there is no residual yet)."""
    n, hidden = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    res_in = residual if residual is not None else x
    launch(_add_rms_norm, (n,), "add_rms_norm", x, res_in, weight, out, res_out, x.stride(0), res_in.stride(0),
           out.stride(0), res_out.stride(0), hidden, eps, HAS_RESIDUAL=residual is not None,
           BLOCK=triton.next_power_of_2(hidden))
    return out, res_out
