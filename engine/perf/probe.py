"""Probe this machine's roofs once: matmul FLOP/s (bf16, fp32) and memory read bandwidth.

Measured with the calling thread's torch thread count (the engine's). Each figure is the median of a
few timed runs after one warm-up. The bandwidth buffer is max(2 GiB, 4x the last-level cache), so
the reads come from memory, not from a large L3. The result is cached per machine (CPU model or GPU
name), thread count and torch version in the user cache dir, with how it was measured.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from engine.perf.roofline import Roofs

GEMM_SIZE = 2048  # (n x n) @ (n x n): 2 n^3 FLOPs, large enough for the library's peak kernel
GEMM_REPEATS = 5
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


def cpu_flags() -> list[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where the platform does not list them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def cpu_description() -> dict:
    """What a benchmark result needs to say about the CPU it ran on: model, logical CPUs, last-level
    cache, the vector/matrix extensions that matter here, and every flag."""
    import os

    flags = cpu_flags()
    return {"model": machine_name(torch.device("cpu")), "logical_cpus": os.cpu_count(),
            "last_level_cache_bytes": last_level_cache_bytes(),
            "isa": {f: f in flags for f in ISA_FLAGS}, "flags": flags}


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


def _timed(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> list[float]:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def measure_gemm(dtype: torch.dtype, device: torch.device, n: int = GEMM_SIZE,
                 repeats: int = GEMM_REPEATS) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = _timed(lambda: torch.mm(a, b), repeats, _sync(device))
    return 2 * n**3 / statistics.median(times)


def measure_bandwidth(device: torch.device, nbytes: int, repeats: int = STREAM_REPEATS) -> float:
    """Read bandwidth: a sum over a float32 buffer (one add per 4 bytes read: the memory is the limit)."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = _timed(lambda: buf.sum(), repeats, _sync(device))
    return nbytes / statistics.median(times)


def _sync(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def measure_roofs(device: torch.device | None = None, gemm_size: int = GEMM_SIZE,
                  stream_bytes: int | None = None) -> Roofs:
    device = device or torch.device("cpu")
    if stream_bytes is None:
        llc = last_level_cache_bytes() if device.type == "cpu" else 0
        stream_bytes = max(MIN_STREAM_BYTES, 4 * llc)
    flops = {name: measure_gemm(dt, device, gemm_size) for name, dt in
             (("bfloat16", torch.bfloat16), ("float32", torch.float32))}
    bw = measure_bandwidth(device, stream_bytes)
    how = (f"GEMM {gemm_size}x{gemm_size}x{gemm_size} (torch.mm), median of {GEMM_REPEATS} after 1 warm-up; "
           f"read bandwidth: sum over a {stream_bytes / 2**30:.2f} GiB float32 buffer, median of "
           f"{STREAM_REPEATS} after 1 warm-up; {torch.get_num_threads()} threads")
    return Roofs(machine=machine_name(device), threads=torch.get_num_threads(), torch_version=torch.__version__,
                 peak_flops=flops, bandwidth_bytes_per_s=bw, how=how,
                 measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def cache_path(device: torch.device, cache_dir: Path | None = None) -> Path:
    from engine.loading.user_dirs import user_dir

    base = cache_dir or user_dir("cache") / "roofline"
    key = f"{machine_name(device)}-{torch.get_num_threads()}t-torch{torch.__version__}"
    return base / ("".join(c if c.isalnum() or c in "-._" else "_" for c in key) + ".json")


def probe_roofs(device: torch.device | None = None, cache_dir: Path | None = None, refresh: bool = False) -> Roofs:
    """The cached roofs for this machine, thread count and torch; measured (a few seconds) when missing."""
    device = device or torch.device("cpu")
    path = cache_path(device, cache_dir)
    if path.exists() and not refresh:
        try:
            return Roofs.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache is measured again
    roofs = measure_roofs(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(roofs.to_dict(), indent=2))
    return roofs
