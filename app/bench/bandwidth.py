"""Achieved memory bandwidth of decode against the device's peak, both measured in the same run.

Decoding reads every weight once per step (a batch shares that read), so bytes of weights x steps per
second is a lower bound on the bandwidth a step achieved (KV reads and activations come on top). The
peak is measured too: a device-to-device copy of a 1 GiB tensor (bytes read + written per second),
what the memory system delivers to a plain streaming kernel, not a datasheet figure.
"""
from __future__ import annotations

import time

import torch

COPY_BYTES = 2**30


def measured_copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second (read + written) of the best of `repeats` copies of nbytes on `device` (1 GiB
    on a GPU, a quarter of that in host memory)."""
    nbytes = nbytes or (COPY_BYTES if device.type == "cuda" else COPY_BYTES // 4)
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_bandwidth(engine, decode_tokens_per_s: dict[str, float], hf_tokens_per_s: float | None) -> dict:
    """One stream: one step per token, each reading the weights once."""
    peak = measured_copy_bandwidth(engine.device)
    weights = engine.weights_bytes
    rates = dict(decode_tokens_per_s, **({"hf_transformers": hf_tokens_per_s} if hf_tokens_per_s else {}))
    return {"weights_bytes": weights, "measured_copy_bytes_per_s": peak,
            "how": "weights bytes x decode steps/s (a lower bound: KV reads not counted) vs a measured "
                   "device-to-device copy (read + write)",
            "achieved_bytes_per_s": {m: weights * r for m, r in rates.items()},
            "share_of_copy_bandwidth": {m: weights * r / peak for m, r in rates.items()}}


def batch_bandwidth(engine, runs: dict[str, dict]) -> dict:
    """Many streams: each step (prefill chunks included) reads the weights once for the whole batch."""
    peak = measured_copy_bandwidth(engine.device)
    weights = engine.weights_bytes
    achieved = {m: weights * r["steps"] / r["seconds"] for m, r in runs.items()}
    return {"weights_bytes": weights, "measured_copy_bytes_per_s": peak,
            "how": "weights bytes x steps/s of the median round (prefill steps included; KV reads not "
                   "counted) vs a measured device-to-device copy (read + write)",
            "achieved_bytes_per_s": achieved,
            "share_of_copy_bandwidth": {m: a / peak for m, a in achieved.items()}}
