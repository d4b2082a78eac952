"""Native CPU kernels, compiled on first use with torch.utils.cpp_extension (needs a C++ compiler and
ninja; the build is cached under torch's extensions directory, ~25 s the first time).

paged_decode.cpp: decode attention straight from the paged KV cache (EngineConfig.attention_backend
"native"). The eager path copies every context into a padded batch and multiplies it with small bf16
matmuls; the kernel streams each sequence's K and V blocks once where they lie, in float32 registers.

stream_linear.cpp: Linear layers for a few rows (decode) that read each weight once, from the one
copy the engine keeps: bf16 rows, and 4-bit codes (half a byte per weight) with group scales
(engine/models/layers/linear.py, engine/quant/weight_only.py).

fused_decode.cpp: one native call per decode step (EngineConfig.fused_decode, engine/runner/fused.py):
the whole transformer for 1..8 decode rows, small ops as raw loops, the products and the attention
through the two files above (one translation unit: it includes them), in one OpenMP parallel region per
step (torch's thread count; each thread a static share of every stage, barriers between stages).
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path

_BUILT: dict[str, object] = {}  # name -> the loaded module, or None after a failed build


def native_decode_applies(model_config, device, dtype) -> bool:
    """The kernel's cases: bf16 on the CPU, head_dim 64 or 128, at most 8 query heads per KV head."""
    import torch

    group = model_config.num_attention_heads // model_config.num_key_value_heads
    return (device.type == "cpu" and dtype == torch.bfloat16 and model_config.head_dim in (64, 128)
            and group <= 8)


def paged_decode_kernel(progress: Callable[[str, float], None] | None = None, portable: bool = False):
    """The compiled paged-decode module (its `paged_decode` function), or None where it cannot be built
    (no compiler, no ninja): callers fall back to the eager path after one warning."""
    return _build("paged_decode", "the paged-attention kernel", progress, portable)


def stream_linear_kernel(progress: Callable[[str, float], None] | None = None, portable: bool = False):
    """The compiled weight-streaming linear module (stream_linear_bf16, stream_linear_int4, pack_int4),
    or None where it cannot be built (after one warning): callers use the library's kernels then."""
    return _build("stream_linear", "the weight-streaming linear kernel", progress, portable)


def fused_decode_kernel(progress: Callable[[str, float], None] | None = None, portable: bool = False):
    """The compiled fused-decode module (FusedModel, Proj), or None where it cannot be built (after one
    warning): the runner keeps the layer-by-layer path then."""
    return _build("fused_decode", "the fused decode-step kernel", progress, portable)


# Sources a kernel's translation unit includes besides itself and common.h (part of its build hash).
_INCLUDES = {"fused_decode": ("stream_linear.cpp", "paged_decode.cpp")}


def _build(source: str, what: str, progress: Callable[[str, float], None] | None, portable: bool):
    """Build (once per machine) or load the extension from `source`.cpp; None after a failed build.
    The build targets this machine's CPU (-march=native: AVX-512 with bf16 dot products where present);
    `portable` builds the plain C++ bodies only (what other CPUs run; the tests check it too)."""
    name = f"inferlab_{source}" + ("_portable" if portable else "") + "_" + _source_digest(source)
    if name not in _BUILT:
        if progress is not None:
            progress(f"loading {what}" if _is_built(name) else f"building {what} (once per machine, ~25 s)", 0.95)
        try:
            from torch.utils.cpp_extension import load

            built = _import_built(name)
            if built is not None:  # built before: no build lock taken (a start killed now leaves none)
                _BUILT[name] = built
                return built
            _clear_stale_lock(name)

            flags = ["-O3", "-march=native", "-fopenmp"] + (["-DINFERLAB_PORTABLE"] if portable else [])
            _BUILT[name] = load(name=name, sources=[str(Path(__file__).with_name(f"{source}.cpp"))],
                                extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as exc:  # noqa: BLE001 (any build failure means: use the library's path)
            warnings.warn(f"native {source} kernel unavailable, using the library's path: {exc}", stacklevel=3)
            _BUILT[name] = None
    return _BUILT[name]


@functools.cache  # read once per process: the kernels' loaders are called on hot paths
def _source_digest(source: str) -> str:
    """A short hash of the kernel's source and shared header, part of its build name: two checkouts with
    different sources (worktrees, versions) then build into different folders of torch's shared
    extension cache instead of rebuilding over each other (and waiting on each other's build lock)."""
    import hashlib

    here = Path(__file__).parent
    digest = hashlib.sha256()
    for f in (here / f"{source}.cpp", here / "common.h", *(here / i for i in _INCLUDES.get(source, ()))):
        digest.update(f.read_bytes())
    return digest.hexdigest()[:10]


def _import_built(name: str):
    """The module built earlier under this name (its name holds the source's digest, so a built one is
    current), imported straight from torch's extension cache; None where there is none. torch's `load`
    takes a lock on the build folder even to find a build up to date, and a process killed meanwhile
    (a screenshot run ending, Ctrl+C during start-up) leaves the lock behind: every later start waits."""
    import importlib.util

    try:
        import torch  # noqa: F401 (the extension links against torch's libraries: load them first)
        from torch.utils.cpp_extension import _get_build_directory

        so = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
        if not so.is_file():
            return None
        spec = importlib.util.spec_from_file_location(name, so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception:  # noqa: BLE001 (anything odd: let torch's load decide, and say what it finds)
        return None


def _is_built(name: str) -> bool:
    """Whether torch's extension cache already holds this kernel (then loading it takes a moment)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return (Path(_get_build_directory(name, verbose=False)) / f"{name}.so").is_file()
    except Exception:  # noqa: BLE001 (a private helper of torch's: if it moves, say "building")
        return False


STALE_LOCK_S = 600  # a build takes ~25 s; a lock this old was left by a process killed mid-build


def _clear_stale_lock(name: str) -> None:
    """torch waits forever on the build lock a killed build leaves behind (the start then hangs at
    "loading the paged-attention kernel"); a lock older than any real build is removed, saying so."""
    import time

    try:
        from torch.utils.cpp_extension import _get_build_directory

        lock = Path(_get_build_directory(name, verbose=False)) / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()
            warnings.warn(f"removed a stale build lock left by an interrupted build: {lock}", stacklevel=3)
    except (ImportError, OSError):
        pass  # nothing to clear, or not ours to clear: torch reports what it must
