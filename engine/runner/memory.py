"""Memory accounting: weights, KV blocks (used / cached / free), activations, other, free.

On CUDA the device total and free bytes are measured with NVML (or torch.cuda when NVML is missing);
on the CPU the KV cache comes from a configured budget and the host's RAM is the device: total and
available bytes come from /proc/meminfo, "other" is the process's resident memory not explained by
weights, KV cache and activations.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from engine.events import MemorySnapshot


def weights_bytes(model: nn.Module) -> int:
    """Bytes of parameters and persistent buffers, each storage counted once (tied embeddings), plus the
    oneDNN-packed copies of Linear weights (engine/models/layers/linear.py)."""
    seen: set[int] = set()
    total = 0
    tensors = [t for _, t in model.named_parameters()] + [b for _, b in model.named_buffers(remove_duplicate=True)]
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total + sum(m.packed_bytes() for m in model.modules() if hasattr(m, "packed_bytes"))


def device_memory(device: torch.device) -> tuple[int, int, str]:
    """(total bytes, free bytes, source) of the device the engine runs on."""
    if device.type == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.total), int(info.free), "nvml"
        except Exception:  # NVML missing or not initialisable: torch.cuda still knows
            free, total = torch.cuda.mem_get_info(device)
            return int(total), int(free), "torch.cuda"
    return _host_memory() + ("budget",)


def _host_memory() -> tuple[int, int]:
    fields = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        return fields["MemTotal"], fields.get("MemAvailable", fields["MemFree"])
    except (OSError, KeyError, ValueError):
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return pages, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def process_resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def snapshot(device: torch.device, weights: int, kv_block_bytes: int, blocks_total: int, blocks_used: int,
             blocks_cached: int, activation_bytes: int, packed_weights: int = 0, lora_device: int = 0,
             lora_host: int = 0) -> MemorySnapshot:
    total, free, source = device_memory(device)
    kv_total = kv_block_bytes * blocks_total
    if device.type == "cuda":
        used = total - free
    else:
        used = process_resident_bytes()
    # on the CPU the host copies of LoRA adapters live in the same memory
    lora = lora_device + (lora_host if device.type != "cuda" else 0)
    other = max(0, used - weights - kv_total - activation_bytes - lora)
    return MemorySnapshot(
        weights_bytes=weights,
        kv_block_bytes=kv_block_bytes,
        kv_blocks_total=blocks_total,
        kv_blocks_used=blocks_used,
        kv_blocks_cached=blocks_cached,
        activation_bytes=activation_bytes,
        other_bytes=other,
        free_bytes=free,
        device_total_bytes=total,
        source=source,
        device=str(device),
        packed_weights_bytes=packed_weights,
        lora_device_bytes=lora_device,
        lora_host_bytes=lora_host,
    )
