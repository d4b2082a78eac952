"""Where the Triton kernels' tests run (engine/kernels/gpu): on a CUDA GPU when torch sees one, else on the CPU
under Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py before anything imports Triton:
triton.jit reads it when a kernel is defined, Triton's own library functions included). Where Triton is not
installed (it has wheels for Linux only) the tests skip."""
from __future__ import annotations

import importlib.util
import os

import pytest

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _device() -> str:
    import torch

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("no GPU and TRITON_INTERPRET is not 1: tests/conftest.py sets it before Triton loads")
    return "cpu"


DEVICE = _device() if HAS_TRITON else "cpu"
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (Linux x86-64 wheels only)")
