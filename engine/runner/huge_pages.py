"""The weights a CPU step streams, moved into memory backed by transparent huge pages.

A decode step reads every weight once from memory, front to back. With 4 KiB pages that stream
crosses a page (and a TLB entry) every 4 KiB, and the hardware prefetchers stop at every page
boundary; with 2 MiB pages it runs 512 times longer between them. On an AMD EPYC Zen 4 (one thread, the
native bf16 kernel on a 49152 x 576 matrix, 2026-12-02, a busy machine) that read ~17 GB/s from torch's
ordinary allocation and ~25 GB/s from memory advised MADV_HUGEPAGE; `scripts/huge_pages_bench.py` measures
whole decode steps both ways, side by side, on the machine it runs on. Linux's default THP mode is
"madvise", and torch asks for huge pages only when THP_MEM_ALLOC_ENABLE=1 is set before its first
allocation, so the engine asks itself.

How: one anonymous mapping per call (an "arena"), aligned to a huge page (2 MiB on x86-64) and advised
MADV_HUGEPAGE, holding every large tensor of the module that owns its whole storage, in module order
(the order the step reads them); each parameter or buffer then points into the arena. Tied weights
stay tied (one copy, both names). Tensors that are views of something else, already in an arena,
small, or not on the CPU are left where they are. An arena lives while any tensor in it does. Where
the platform has no MADV_HUGEPAGE (macOS, Windows) or THP is off ("never"), nothing moves. The engine's
own weights need no move: ArenaPlan lays out their arena before they are filled, and the model is built
into it (one copy of the checkpoint).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import torch
from torch import nn

from engine.kernels.huge_arena import HUGE_PAGE, PMD_SIZE, huge_page_bytes  # noqa: F401 (this module's names too)
from engine.kernels.huge_arena import arena as _arena

# Tensors below this stay where they are (norm weights, biases: a few KiB). Not 1 MiB: SmolLM2-135M's o_proj
# (576 x 576 bf16, 648 KiB) stayed on 4 KiB pages and a fused decode step read it at ~14 GB/s against ~28
# for its neighbours (AMD EPYC Zen 4, 1 thread): 0.7 ms of an 11 ms step.
MIN_BYTES = 64 << 10
TABLE_MIN_BYTES = 1 << 20
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The kernel's THP mode ("always", "madvise", "never"), None where there is no such setting."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return None
    chosen = [w for w in text.split() if w.startswith("[")]
    return chosen[0].strip("[]") if chosen else None


def _why_not() -> str | None:
    """Why huge pages cannot be asked for here, or None where they can."""
    if os.environ.get("INFERLAB_HUGE_PAGES", "1") == "0":  # off, to measure without
        return "off (INFERLAB_HUGE_PAGES=0)"
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return "not on this platform (no MADV_HUGEPAGE)"
    mode = thp_mode()
    if mode not in ("always", "madvise"):
        return f"off: transparent huge pages are {mode or 'unknown'} here"
    return None


def available() -> bool:
    """Huge pages can be asked for here."""
    return _why_not() is None


def describe() -> str:
    """For a bench's JSON: whether the weights go onto huge pages here, and why not."""
    return _why_not() or (f"weights advised MADV_HUGEPAGE ({huge_page_bytes() >> 20} MiB pages, "
                          f"THP mode {thp_mode()})")


def _owned(t: torch.Tensor, min_bytes: int) -> bool:
    """A CPU tensor that is its storage, whole (not a view into another tensor or an arena)."""
    return (t.device.type == "cpu" and t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.nbytes and t.nbytes >= min_bytes)


def _holders(module: nn.Module, min_bytes: int) -> dict[int, list[tuple[nn.Module, str]]]:
    """Storage pointer -> every (module, attribute) holding that tensor, for the tensors to move (a tied
    weight has two holders). Pointers, not tensors: each old tensor can be freed as soon as it moved."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in module.modules():
        for name, t in list(mod._parameters.items()) + list(mod._buffers.items()):
            # a derived table (the rotary cos/sin: not saved, read a row a step) only from 1 MiB, as before
            least = max(min_bytes, TABLE_MIN_BYTES) if name in mod._non_persistent_buffers_set else min_bytes
            if t is not None and _owned(t, least):
                holders.setdefault(t.data_ptr(), []).append((mod, name))
    return holders


def _get(mod: nn.Module, name: str) -> torch.Tensor:
    return mod._parameters[name] if name in mod._parameters else mod._buffers[name]


def _set(mod: nn.Module, name: str, new: torch.Tensor) -> None:
    if name in mod._parameters:
        mod._parameters[name].data = new  # the same Parameter object: optimisers, ties, hooks keep it
    else:
        mod._buffers[name] = new


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros(shape), on huge pages where the CPU tensor is large and they can be asked for (the roof
    probe's buffer, which must lie on pages like the weights'). Not the KV cache: see
    engine/runner/model_runner.kv_zeros."""
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < MIN_BYTES or not available():
        return torch.zeros(shape, dtype=dtype, device=device)
    return _arena(nbytes).view(dtype).view(shape)  # its callers fill it at once (the probe, the benches)


def move_to_huge_pages(module: nn.Module, min_bytes: int = MIN_BYTES) -> int:
    """Move `module`'s large CPU tensors into one huge-page arena (see the module docstring); the bytes
    moved (0 where huge pages are not available or nothing qualifies). One tensor at a time: each old
    one is dropped as soon as its copy is in, so the peak is the model plus one tensor, not two models
    (the arena's pages are taken as they are written)."""
    if not available():
        return 0
    holders = _holders(module, min_bytes)
    if not holders:
        return 0
    first = {ptr: _get(*hs[0]) for ptr, hs in holders.items()}
    sizes = {ptr: -(-t.nbytes // 64) * 64 for ptr, t in first.items()}  # each start on a cache line
    del first
    raw = _arena(sum(sizes.values()))
    offset = moved = 0
    with torch.no_grad():
        for ptr, hs in holders.items():
            old = _get(*hs[0])
            new = raw[offset:offset + old.nbytes].view(old.dtype).view(old.shape)
            new.copy_(old)
            for mod, name in hs:
                _set(mod, name, new)
            moved += old.nbytes
            offset += sizes[ptr]
            del old
    return moved


class ArenaPlan:
    """One huge-page arena for a model's large weights, taken before they are filled: build_model's
    `allocate` hook points each piece's large parameters into it as the piece is made, so the checkpoint is
    copied once, straight onto huge pages, not into ordinary pages and then again by move_to_huge_pages
    (which then finds them in place). Slots in module order with cache-line starts, as move_to_huge_pages
    lays them out; small tensors have none and stay where they are made. A slot the fill never writes (a
    tied lm_head's: that piece is never made) costs no memory: the arena's pages are taken as they are
    written. The arena lives while any weight in it does, so use it only where every large weight is kept
    for the model's life (the target's are: its 16-bit originals stay for requantizing). Where huge pages
    cannot be asked for, nothing happens."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._slots: dict[str, tuple[int, torch.Size, torch.dtype, int]] | None = None
        self._names: dict[int, str] = {}
        self._raw: torch.Tensor | None = None
        self.placed = 0  # bytes of weights pointed into the arena

    def _plan(self, model: nn.Module) -> None:
        self._names = {id(m): n for n, m in model.named_modules()}
        slots: dict[str, tuple[int, torch.Size, torch.dtype, int]] = {}
        offset = 0
        for name, p in model.named_parameters():  # the pieces not yet made are on `meta`: shapes only
            dtype = self.dtype if p.is_floating_point() else p.dtype
            nbytes = p.numel() * dtype.itemsize
            if nbytes < MIN_BYTES:
                continue
            slots[name] = (offset, p.shape, dtype, nbytes)
            offset += -(-nbytes // 64) * 64
        self._slots = slots
        self._raw = _arena(offset) if slots and available() else None

    def __call__(self, model: nn.Module, piece: nn.Module) -> None:
        """Point `piece`'s large parameters (just made, not yet filled) into the arena."""
        if self._slots is None:
            self._plan(model)
        prefix = self._names.get(id(piece))
        if self._raw is None or prefix is None:
            return
        for name, p in piece.named_parameters(prefix=prefix):
            slot = self._slots.get(name)
            if slot is None or p.device.type != "cpu" or p.shape != slot[1] or p.dtype != slot[2]:
                continue
            offset, shape, dtype, nbytes = slot
            p.data = self._raw[offset:offset + nbytes].view(dtype).view(shape)
            self.placed += nbytes


def huge_page_bytes_in_use() -> int | None:
    """This process's anonymous memory on huge pages now (Linux's AnonHugePages), None where unknown."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
