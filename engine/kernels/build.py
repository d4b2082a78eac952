"""Compiling the native module for a tier, once per machine: its compiler flags, its build name (tier,
OpenMP, a hash of the sources and flags), and the compile itself under a lock shared by every process on
the machine (torch.utils.cpp_extension caches the result; load.py loads it)."""
from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from pathlib import Path

from engine.kernels import detect, load

_FLAGS = {
    "portable": ["-DINFERLAB_PORTABLE"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16",
               "-mavx512vnni"],
    "neon": ["-march=armv8-a"],  # + dotprod where the CPU has it (tier_flags)
}


FAILED: dict[str, str] = {}  # build name -> the first line of why it failed


def tier_flags(tier: str) -> list[str]:
    if detect.neon_with_sdot(tier):
        return ["-march=armv8.2-a+dotprod"]
    return list(_FLAGS[tier])


_SOURCES = ("module.cpp", "stream_linear.cpp", "paged_decode.cpp", "fused_decode.cpp", "sample_rows.cpp",
            "torch_common.h", "threads.h")
OPENMP_ENV = "INFERLAB_KERNELS_OPENMP"  # "0": build without OpenMP (the tests; as on macOS)


def _openmp_wanted() -> bool:
    return os.environ.get(OPENMP_ENV, "").strip() != "0"


def build_name(tier: str, openmp: bool | None = None) -> str:
    """The build's name (torch's extension cache folder): the tier, whether it has OpenMP, and a hash of the
    sources, the tier's compiler flags and the architecture. A cache can be shared by machines (a home on
    NFS, a container image): on NEON the flags differ by CPU (a build with sdot would die on an Arm CPU
    without it), and the portable tier's flags are the same on x86 and Arm."""
    import hashlib

    openmp = _openmp_wanted() if openmp is None else openmp
    variant = "neon_sdot" if detect.neon_with_sdot(tier) else tier
    key = " ".join([_source_digest(), detect.machine_name(), *tier_flags(tier)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"inferlab_kernels_{variant}{'' if openmp else '_noomp'}_{digest}"


@functools.cache  # read once per process: the loaders are called on hot paths
def _source_digest() -> str:
    """A short hash of every source the module compiles, part of its build name: two checkouts with
    different sources (worktrees, versions) build into different folders of torch's extension cache."""
    import hashlib

    here = Path(__file__).parent
    digest = hashlib.sha256()
    for f in sorted([*(here / s for s in _SOURCES), *(here / "core").glob("*.h")]):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:10]


def compile_build(name: str, tier: str):
    """Build `name`; where a build with OpenMP fails, once more without it (as on macOS's Apple clang,
    which refuses -fopenmp); None after one warning where neither builds."""
    without = build_name(tier, openmp=False)
    try:
        return _load(name, tier, openmp=name != without)
    except Exception as exc:  # noqa: BLE001 (any build failure means: use torch's kernels)
        why = first_line(exc)
    if name != without:
        try:
            built = _load(without, tier, openmp=False)
            warnings.warn(f"native kernels ({tier}) built without OpenMP (their own thread pool): {why}",
                          stacklevel=4)
            return built
        except Exception:  # noqa: BLE001 (the first failure says more: it is the one reported)
            pass
    FAILED[name] = why
    warnings.warn(f"native kernels ({tier}) unavailable, running on torch's kernels: {why}", stacklevel=4)
    return None


def _load(name: str, tier: str, openmp: bool):
    from torch.utils.cpp_extension import load as torch_build  # builds, then imports

    with _machine_build_lock(name):
        built = load.import_built(name, locked=True)  # another process may have built it while this one waited
        if built is not None:
            return built
        _clear_dead_lock(name)
        omp = ["-fopenmp"] if openmp else []
        module = torch_build(name=name, sources=[str(Path(__file__).with_name("module.cpp"))],
                             extra_cflags=["-O3", *omp, *tier_flags(tier)], extra_ldflags=omp, verbose=False)
        load.write_digest(load.build_dir(name) / f"{name}.so")  # finished: loadable without the lock from now on
        return module


def first_line(exc: Exception) -> str:
    """The part of a build error a person can act on: the compiler's first error line, else the message."""
    text = str(exc)
    for line in text.splitlines():
        if "error" in line.lower() and "ninja" not in line.lower():
            return line.strip()[:300]
    return (text.splitlines() or [type(exc).__name__])[0][:300]


@contextlib.contextmanager
def _machine_build_lock(name: str):
    """An exclusive lock on this build across processes, held while compiling. The kernel releases it when
    its holder dies, so a process that finds torch's own lock file while holding this one knows that
    file was left by a build that died (where flock is missing, Windows, the lock file's age decides)."""
    path = load.build_dir(name).with_suffix(".inferlab-lock")
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


STALE_LOCK_S = 600  # without flock: a lock this old was left by a process killed mid-build


def _clear_dead_lock(name: str) -> None:
    """torch waits forever on the build lock a killed build leaves behind. Under the machine build lock no
    live process is building, so a lock file there is dead: removed at once, saying so (without flock:
    one older than any real build)."""
    try:
        import fcntl  # noqa: F401
        have_flock = True
    except ImportError:
        have_flock = False
    try:
        lock = load.build_dir(name) / "lock"
        if lock.exists() and (have_flock or time.time() - lock.stat().st_mtime > STALE_LOCK_S):
            lock.unlink()
            warnings.warn(f"removed a build lock left by a build that did not finish: {lock}", stacklevel=4)
    except (ImportError, OSError):
        pass  # nothing to clear, or not ours to clear: torch reports what it must
