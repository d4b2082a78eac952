"""The one device -> host copy of a step's results (the sampled tokens, every verify's decisions and
finiteness, logprobs): a step waits for the device once, here.

On CUDA the values go into pinned host memory with a non_blocking copy and one wait on the stream (a
copy into pageable memory would stage through a driver buffer); elsewhere `tolist` is already the one
copy. `count` counts calls: the tests hold the step path to one.
"""
from __future__ import annotations

import struct

import torch

from engine.kernels.gpu.launches import transfer

count = 0  # read-backs so far in this process (the tests read it before and after a step)


def to_host(values: torch.Tensor) -> list[int]:
    """A 1-D integer tensor's values on the host: the step's one wait for the device."""
    global count
    count += 1
    transfer("read_back")
    if values.device.type != "cuda":
        return values.tolist()
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    torch.cuda.current_stream(values.device).synchronize()
    return host.tolist()


def float_bits(values: torch.Tensor) -> torch.Tensor:
    """float32 values as int64 bit patterns, to travel in the same integer copy (floats_from_bits undoes it)."""
    return values.float().contiguous().view(torch.int32).long()


def floats_from_bits(bits: list[int]) -> list[float]:
    return list(struct.unpack(f"{len(bits)}f", struct.pack(f"{len(bits)}i", *bits)))
