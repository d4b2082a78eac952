"""Probe this machine's roofs once: matmul FLOP/s (bf16, fp32) and memory read bandwidth.

Measured with the calling thread's torch thread count (the engine's). Each figure is the median of a
few timed runs after one warm-up, within a time limit (PROBE_TIME_LIMIT_S): the GEMM grows from 256
until one call is long enough to time, so a dtype the CPU emulates is measured small, not for minutes.
The bandwidth buffer is max(2 GiB, 4x the last-level cache), so
the reads come from memory, not from a large L3. The result is cached per machine (CPU model or GPU
name), thread count and torch version in the user cache dir, with how it was measured.
"""
from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from engine.files import read_json
from engine.kernels import cpu_flags, unconfirmed_flags
from engine.perf.roofline import Roofs
from engine.runner import huge_pages

GEMM_SIZE = 2048  # (n x n) @ (n x n): 2 n^3 FLOPs, large enough for the library's peak kernel
GEMM_MIN_SIZE = 256  # the first size tried; it doubles while a call is shorter than GEMM_MIN_CALL_S
GEMM_MIN_CALL_S = 0.05
GEMM_REPEATS = 5
PROBE_TIME_LIMIT_S = 20.0  # the whole probe; a busy machine gets fewer repeats, never minutes
MIN_STREAM_BYTES = 2 * 2**30
STREAM_REPEATS = 3


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16",
             "amx_int8", "avx512_fp16")  # the ones the CPU kernels (ours, oneDNN, llama.cpp) pick paths by


def cpu_description() -> dict:
    """What a benchmark result needs to say about the CPU it ran on: model, logical CPUs, last-level
    cache, the vector/matrix extensions that matter here, and every flag; `flags_not_confirmed`: those
    /proc/cpuinfo lists but the CPU does not run (an emulator: engine.kernels.cpu_flags)."""
    import os

    flags = cpu_flags()
    return {"model": machine_name(torch.device("cpu")), "logical_cpus": os.cpu_count(),
            "last_level_cache_bytes": last_level_cache_bytes(),
            "isa": {f: f in flags for f in ISA_FLAGS}, "flags": sorted(flags),
            "flags_not_confirmed": sorted(unconfirmed_flags())}


def last_level_cache_bytes() -> int:
    """The largest CPU cache sysfs reports (0 when unknown)."""
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return best


def device_cache_bytes(device: torch.device) -> int:
    """The last-level cache in front of `device`'s memory: the GPU's L2 on CUDA, else the CPU's."""
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    return last_level_cache_bytes()


def _timed(fn: Callable[[], object], repeats: int, sync: Callable[[], None], deadline: float = math.inf,
           times: list[float] | None = None) -> list[float]:
    """Up to `repeats` timed calls in all (`times`: those already taken, after their warm-up; else one
    warm-up first); at least one, none begun after `deadline`."""
    if times is None:
        fn()
        sync()
        times = []
    while len(times) < repeats and (not times or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def measure_gemm(dtype: torch.dtype, device: torch.device, n: int = GEMM_SIZE, repeats: int = GEMM_REPEATS,
                 deadline: float = math.inf) -> tuple[float, int]:
    """(FLOP/s, the size measured): (m x m) @ (m x m), m doubling from GEMM_MIN_SIZE until one call takes
    GEMM_MIN_CALL_S or m reaches n. A dtype the CPU emulates (bf16 without native dot products: 0.27
    GFLOP/s on a Zen 3) stops small instead of taking minutes at n = 2048."""
    m = min(GEMM_MIN_SIZE, n)
    sync = _sync(device)
    while True:
        a = torch.randn(m, m, device=device).to(dtype)
        b = torch.randn(m, m, device=device).to(dtype)
        first = _timed(lambda a=a, b=b: torch.mm(a, b), 1, sync)  # after its warm-up
        if first[0] >= GEMM_MIN_CALL_S or m >= n or time.perf_counter() >= deadline:
            break
        m = min(2 * m, n)
    times = _timed(lambda: torch.mm(a, b), repeats, sync, deadline, times=first)
    return 2 * m**3 / statistics.median(times), m


def measure_bandwidth(device: torch.device, nbytes: int, repeats: int = STREAM_REPEATS,
                      deadline: float = math.inf) -> float:
    """Read bandwidth: a sum over a float32 buffer (one add per 4 bytes read: the memory is the limit). On
    the CPU the buffer lies on huge pages where the engine's weights do (engine/runner/huge_pages.py):
    the roof is that of the memory the steps read."""
    buf = huge_pages.zeros((nbytes // 4,), torch.float32, device).fill_(1.0)
    times = _timed(lambda: buf.sum(), repeats, _sync(device), deadline)
    return nbytes / statistics.median(times)


def _sync(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def measure_roofs(device: torch.device | None = None, gemm_size: int = GEMM_SIZE,
                  stream_bytes: int | None = None, time_limit_s: float = PROBE_TIME_LIMIT_S) -> Roofs:
    """The roofs within about `time_limit_s` (past it, no new repeat starts; each figure keeps at least one)."""
    device = device or torch.device("cpu")
    started = time.perf_counter()
    deadline = started + time_limit_s
    if stream_bytes is None:
        llc = last_level_cache_bytes() if device.type == "cpu" else 0
        stream_bytes = max(MIN_STREAM_BYTES, 4 * llc)
    flops, sizes = {}, {}
    for name, dt in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        flops[name], sizes[name] = measure_gemm(dt, device, gemm_size, deadline=deadline)
    bw = measure_bandwidth(device, stream_bytes, deadline=deadline)
    took = time.perf_counter() - started
    cut = f"; cut short by its {time_limit_s:.0f} s limit (fewer repeats)" if took > time_limit_s else ""
    how = (f"GEMM bf16 {sizes['bfloat16']}^3, fp32 {sizes['float32']}^3 (torch.mm; the size doubles up to "
           f"{gemm_size} until a call takes {GEMM_MIN_CALL_S * 1e3:.0f} ms), median of up to {GEMM_REPEATS} after "
           f"1 warm-up; read bandwidth: sum over a {stream_bytes / 2**30:.2f} GiB float32 buffer{_pages(device)}, "
           f"median of up to {STREAM_REPEATS} after 1 warm-up; {torch.get_num_threads()} threads; {took:.1f} s{cut}")
    return Roofs(machine=machine_name(device), threads=torch.get_num_threads(), torch_version=torch.__version__,
                 peak_flops=flops, bandwidth_bytes_per_s=bw, how=how,
                 measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _pages(device: torch.device) -> str:
    return " on huge pages" if device.type == "cpu" and huge_pages.available() else ""


def cache_path(device: torch.device, cache_dir: Path | None = None) -> Path:
    from engine.loading.user_dirs import user_dir

    base = cache_dir or user_dir("cache") / "roofline"
    pages = "-hugepages" if _pages(device) else ""  # the bandwidth differs with the page size
    key = f"{machine_name(device)}-{torch.get_num_threads()}t-torch{torch.__version__}{pages}"
    return base / ("".join(c if c.isalnum() or c in "-._" else "_" for c in key) + ".json")


def cached_roofs(device: torch.device | None = None, cache_dir: Path | None = None) -> Roofs | None:
    """The roofs stored for this machine, thread count and torch, or None (none yet, or damaged)."""
    path = cache_path(device or torch.device("cpu"), cache_dir)
    try:
        return Roofs.from_dict(read_json(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a damaged cache is measured again


def probe_roofs(device: torch.device | None = None, cache_dir: Path | None = None, refresh: bool = False,
                time_limit_s: float = PROBE_TIME_LIMIT_S) -> Roofs:
    """The cached roofs for this machine, thread count and torch; measured (within `time_limit_s`) when
    missing."""
    device = device or torch.device("cpu")
    if not refresh and (roofs := cached_roofs(device, cache_dir)) is not None:
        return roofs
    roofs = measure_roofs(device, time_limit_s=time_limit_s)
    path = cache_path(device, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(roofs.to_dict(), indent=2))
    return roofs
