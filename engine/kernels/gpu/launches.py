"""Counting a step's kernel launches from the code that launches them (structure, not timing).

Inside `counting()`, every Triton kernel launched through `launch` is counted once, and a torch dispatch
mode (`TorchOpCounter`) counts the torch ops that would launch a CUDA kernel: views, allocations and
metadata ops launch none and are left out, and so is whatever a Triton kernel does inside itself (under the
interpreter it runs Python and numpy, sometimes through torch). Copies between the host and the device that
the CPU makes as host operations (no torch op) are counted where the code makes them (`transfer`). Each
library op is counted as one kernel: a
cuBLAS product may be one or two (split-K), which only a GPU profile says (scripts/gpu_check.py's
profile step)."""
from __future__ import annotations

import contextlib
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field

from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class LaunchCount:
    kernels: Counter = field(default_factory=Counter)  # name -> launches (Triton kernels and torch ops)
    inside_kernel: int = 0  # > 0 while a Triton kernel or host work runs: its ops are not launches

    @property
    def total(self) -> int:
        return sum(self.kernels.values())


_COUNT: ContextVar[LaunchCount | None] = ContextVar("inferlab_launch_count", default=None)

# ops that launch no kernel on a GPU: views and aliases, allocations, metadata
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "detach_", "alias",
              "lift_fresh", "_to_copy_noop", "set_", "resize_", "record_stream", "is_nonzero", "size",
              "stride", "sym_size", "sym_stride", "sym_numel", "_local_scalar_dense"}


def _launches_kernel(func) -> bool:
    if getattr(func, "is_view", False):
        return False
    name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
    return name not in _NO_KERNEL


class TorchOpCounter(TorchDispatchMode):
    """Counts into the active LaunchCount every torch op that launches a kernel (see the module doc)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        count = _COUNT.get()
        if count is not None and not count.inside_kernel and _launches_kernel(func):
            count.kernels[f"torch:{func.__name__.split('.')[0]}"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting():
    """Count the launches of the code inside (Triton kernels and torch ops); yields the LaunchCount."""
    count = LaunchCount()
    token = _COUNT.set(count)
    try:
        with TorchOpCounter():
            yield count
    finally:
        _COUNT.reset(token)


@contextlib.contextmanager
def on_host():
    """Work on host tensors (a step's inputs gathered into pinned memory): on a GPU these torch ops run on the CPU
    and launch no kernel, so a count leaves them out (on the CPU the host and the device are one)."""
    count = _COUNT.get()
    if count is not None:
        count.inside_kernel += 1
    try:
        yield
    finally:
        if count is not None:
            count.inside_kernel -= 1


def transfer(name: str) -> None:
    """Count a copy between the host and the device at a place where the step makes one on a GPU (the CPU runs
    the same line as a host operation, with no torch op to see): `name` says which."""
    count = _COUNT.get()
    if count is not None:
        count.kernels[f"copy:{name}"] += 1


def launch(kernel, grid, name: str, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), counted as one launch of `name` where a count is active."""
    count = _COUNT.get()
    if count is None:
        kernel[grid](*args, **kwargs)
        return
    count.kernels[f"triton:{name}"] += 1
    count.inside_kernel += 1
    try:
        kernel[grid](*args, **kwargs)
    finally:
        count.inside_kernel -= 1
