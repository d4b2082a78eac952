"""Single-row linear layers for decode on the CPU: y = x W^T with one row in x.

At one token per step a linear layer is a matrix-vector product: each weight is read once and used
for one multiply-add, so its speed is memory bandwidth. The library bf16 path (oneDNN) reaches
~12-16 GB/s on the 2-core test machine; the same product written as a reduction and compiled by
inductor (bf16 loads widened to fp32, vectorised along K, threads over the output rows) reaches
20-34 GB/s (measured per layer shape: gate_up 226 -> 155 us, down 118 -> 88 us, lm_head 4.4 ->
1.7 ms). With two or more rows the library kernel wins again (it reuses each weight row across the
rows), so only single rows take this path; results agree with F.linear to bf16 rounding.
Held hot in cache, oneDNN's packed weights (engine/models/layers/linear.py) run one row faster still; but a
decode step streams all weights from memory, and there this kernel wins (one stream, compile=True,
`inferlab bench decode`: 58-63 tokens/s through it vs 42-44 through the packed weights), so single
rows keep it under compile=True.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false


def gemv_math(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (1, K), weight (N, K) -> (1, N) in x's dtype, accumulated in float32."""
    return (weight.float() * x.float()).sum(-1).unsqueeze(0).to(x.dtype)


class CompiledGemv:
    """The compiled gemv_math, built on first use (one kernel for every layer shape: dynamic=True)."""

    def __init__(self) -> None:
        self._fn = None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._fn is None:
            self._fn = torch.compile(gemv_math, dynamic=True)
        return self._fn(x, weight)


def wants_gemv(x: torch.Tensor) -> bool:
    """A single 16-bit row on the CPU: where the compiled kernel beats the library. In a compiled region
    whose row count is a symbol (1-8 rows in one graph, LlamaForCausalLM.forward) the answer is no: a
    guard on it would split the graph again."""
    return (x.dim() == 2 and guard_or_false(x.shape[0] == 1) and x.device.type == "cpu"
            and x.dtype in (torch.bfloat16, torch.float16))
