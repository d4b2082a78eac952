"""Memory that starts on a huge page and is advised MADV_HUGEPAGE (transparent huge pages), as a torch tensor:
where the engine keeps the weights a step streams (engine/runner/huge_pages.py), and where the kernels' tiers
are timed (tier_choice.py), so both read the same kind of pages."""
from __future__ import annotations

import mmap
from pathlib import Path

HUGE_PAGE = 2 << 20  # x86-64's and 4 KiB-page Arm's; Arm kernels with 16/64 KiB pages have larger ones
PMD_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")


def huge_page_bytes() -> int:
    """The size of one transparent huge page here (what an arena is aligned to)."""
    try:
        return int(PMD_SIZE.read_text())
    except (OSError, ValueError):
        return HUGE_PAGE


def arena(nbytes: int):
    """`nbytes` of zeroed memory starting on a huge-page boundary, advised MADV_HUGEPAGE where the platform
    has it, as a uint8 tensor (the kernel zero-fills its pages when first touched: nothing is written here)."""
    import torch

    # private: a shared anonymous mapping is shmem, which follows shmem's THP setting (usually "never")
    page = huge_page_bytes()
    region = mmap.mmap(-1, nbytes + page, flags=mmap.MAP_PRIVATE)  # address space only, until written
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive while any view of it lives
    start = (-raw.data_ptr()) % page
    return raw[start:start + nbytes]
