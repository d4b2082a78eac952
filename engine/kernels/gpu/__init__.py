"""The CUDA decode step's own kernels, written in Triton: what a step of the GPU path runs besides the
library's matrix products (cuBLAS) and the embedding lookup.

- `norm.add_rms_norm`: the residual add and RMSNorm of a pre-norm layer in one kernel;
- `rope.rope_and_cache`: q and k rotated (Qwen3's per-head q/k norm first), k and v written into the paged
  cache at each token's slot, in one kernel;
- `attention.paged_decode`: decode attention reading K/V through each sequence's block table (GQA heads of
  a KV head together, the context split over programs for long sequences, lengths and tables read from
  tensors, so one CUDA graph serves every context length), and `attention.paged_prefill`: prompt chunks,
  causal from the chunk's offset, over the same paged cache;
- `act.silu_and_mul`: SwiGLU;
- `sampling.sample`: greedy, temperature, top-k and top-p for a whole batch in one kernel, each row's
  finiteness checked in the same pass, written into one integer tensor (the step's one read-back).

Triton is imported only when these kernels are used: on CUDA, or on the CPU under Triton's interpreter
(TRITON_INTERPRET=1 with CPU tensors, how the test suite runs every kernel against the torch layers). The
CPU engine never imports it. Every launch goes through `launches.launch`, which counts kernels where a
count was asked for (tests/test_gpu_path.py holds a decode step to its budget).
"""
from __future__ import annotations

import importlib.util
import os


def interpreting() -> bool:
    """Triton's interpreter runs the kernels (TRITON_INTERPRET=1): on the CPU, over CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def unavailable(device_type: str) -> str | None:
    """Why the Triton kernels cannot run on this device type, or None when they can: CUDA with Triton
    installed, or the CPU under Triton's interpreter (the tests)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    if device_type == "cuda":
        return None
    if device_type == "cpu" and interpreting():
        return None
    return f"Triton kernels run on CUDA (or on the CPU under TRITON_INTERPRET=1), not on {device_type!r}"


def load():
    """The kernels' module (imports Triton): call only where `unavailable` said None."""
    from engine.kernels.gpu import ops

    return ops
