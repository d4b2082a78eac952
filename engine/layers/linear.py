"""Linear layers. Quantized variants (engine/quant.py) replace these by module swap."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.gemv import gemv_math, wants_gemv


class Linear(nn.Module):
    """y = x W^T + b, weights stored (out_features, in_features) like Hugging Face checkpoints.
    `gemv`, when set (EngineConfig.compile), computes single 16-bit rows on the CPU: see
    engine/layers/gemv.py."""

    gemv = None

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv is not None and wants_gemv(x):
            # inside a compiled region the math is traced into the region's own graph
            y = gemv_math(x, self.weight) if torch.compiler.is_compiling() else self.gemv(x, self.weight)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, with gate and up side by side in the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
