"""The per-row batched LoRA update (S-LoRA / Punica style), as a module swap around a projection.

One step's flat batch mixes rows of many adapters. The base product runs once for every row (whatever
module is there: 16-bit, packed or quantized); then, per device slot holding an adapter in this batch,
its rows get  y[rows] += (x[rows] A^T) B^T  ("shrink" to rank r, then "expand"; the scale is folded into
B). Rows without an adapter are in no group and cost nothing; the whole model never runs per adapter.

Fused projections (q/k/v, gate/up) hold one A stack for all their parts (one shrink of x) and one B
stack per part (each expands into its own columns of y). Stacks are preallocated for `max_loras` slots
at `max_rank`; an adapter of lower rank uses the first columns. They are plain tensors, not buffers, so
the weights' byte count stays the base model's; the pool (engine/lora/pool.py) reports them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from engine.models.layers.linear import LinearWrapper

Rows = slice | torch.Tensor  # the rows of one adapter in the flat batch: a contiguous run, or their indices


@dataclass(slots=True)
class LoraRows:
    """Which rows of the current forward pass belong to which device slot (set by the pool before each
    forward, read by every LoraLinear; empty = no adapter in the batch)."""

    segments: list[tuple[int, Rows]] = field(default_factory=list)


def lora_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype adapters are stored and multiplied in. On the CPU the library's 16-bit products are slow
    for these thin shapes (rank 8: 42 + 70 us for one 16-row gate shrink + expand in bf16, 6 + 7 us in
    float32, measured), so the CPU keeps float32; a GPU keeps the model's dtype."""
    return torch.float32 if device.type == "cpu" else dtype


class LoraLinear(LinearWrapper):
    def __init__(self, base: nn.Module, in_features: int, out_sizes: tuple[int, ...], max_loras: int,
                 max_rank: int, rows: LoraRows, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.base = base
        self.rows = rows
        self.out_sizes = out_sizes
        self.offsets = [sum(out_sizes[:j]) for j in range(len(out_sizes))]
        dt = lora_dtype(device, dtype)
        # (slots, in, parts * max_rank): each slot's parts' A^T side by side (one shrink for all of them)
        self.lora_a = torch.zeros(max_loras, in_features, len(out_sizes) * max_rank, device=device, dtype=dt)
        # per part: (slots, max_rank, out_part), the scaled B^T
        self.lora_b = [torch.zeros(max_loras, max_rank, n, device=device, dtype=dt) for n in out_sizes]
        # per slot, what forward multiplies by (views into the stacks, made once by load):
        # (A^T (in, sum of ranks), [(its columns of the shrunk rows, B^T (r, out_part), y's columns)]) or None
        self.plans: list[tuple[torch.Tensor, list[tuple[slice, torch.Tensor, slice]]] | None] = [None] * max_loras

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [self.lora_a, *self.lora_b])

    def load(self, slot: int, parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy an adapter's (A (r, in), scaled B (out_part, r)) for each part it updates into `slot`."""
        plan, col = [], 0
        self.lora_a[slot].zero_()
        for j, (a, b) in sorted(parts.items()):
            r = a.shape[0]
            self.lora_a[slot, :, col : col + r].copy_(a.T)
            self.lora_b[j][slot].zero_()
            self.lora_b[j][slot, :r].copy_(b.T)
            out = slice(self.offsets[j], self.offsets[j] + self.out_sizes[j])
            plan.append((slice(col, col + r), self.lora_b[j][slot, :r], out))
            col += r
        self.plans[slot] = (self.lora_a[slot, :, :col], plan)

    def clear(self, slot: int) -> None:
        self.plans[slot] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_updates(x, self.base(x))

    @torch.compiler.disable  # data-dependent row groups: eager, between the compiled regions (a graph break)
    def add_updates(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (n, out) += each row's adapter update, in place; x (n, in)."""
        for slot, rows in self.rows.segments:
            plan = self.plans[slot]
            if plan is None:  # this adapter leaves this projection alone
                continue
            a_t, parts = plan
            shrunk = x[rows].to(a_t.dtype) @ a_t  # (m, sum of ranks)
            for cols_in, b_t, cols_out in parts:
                delta = (shrunk[:, cols_in] @ b_t).to(y.dtype)  # (m, out_part)
                if isinstance(rows, slice):
                    y[rows, cols_out] += delta
                else:
                    y[:, cols_out].index_add_(0, rows, delta)
        return y


def lora_delta_reference(x: torch.Tensor, a: torch.Tensor, b_scaled: torch.Tensor) -> torch.Tensor:
    """The readable update of one row: B (A x), in float32 ((in,) -> (out,)); the tests hold the batched
    path to it."""
    return b_scaled.float() @ (a.float() @ x.float())
