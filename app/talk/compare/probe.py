"""A memory-bandwidth probe: how fast this machine streams a tensor much larger than its caches.
The vram-bottleneck comparison divides the bytes one decode step must read by this rate to predict the
decode ceiling (labelled predicted), next to the measured step."""
from __future__ import annotations

import time

PROBE_BYTES = 256 * 2**20
REPEATS = 5


def probe_bandwidth(device: str = "cpu") -> float:
    """Bytes per second of the best of a few full reductions over PROBE_BYTES: float32, the type the
    vector units add natively, so the sum waits on memory rather than on conversions."""
    import torch

    x = torch.ones(PROBE_BYTES // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(REPEATS):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.sum()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return PROBE_BYTES / best
