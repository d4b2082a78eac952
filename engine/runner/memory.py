"""Memory accounting: weights, KV blocks (used / cached / free), activations, other, free.

On CUDA the device total and free bytes are measured with NVML (or torch.cuda when NVML is missing),
this process's bytes by torch's allocator ("other" = what it holds beyond weights, KV and activations);
on the CPU the KV cache comes from a configured budget and the host's RAM is the device: total and
available bytes come from /proc/meminfo, "other" is the process's resident memory not explained by
weights, KV cache and activations.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from engine.events import MemorySnapshot


def unique_tensor_bytes(tensors) -> int:
    """Bytes of `tensors`, each counted once (tied embeddings: one table). A tensor counts its own bytes,
    not its storage's: on the CPU the weights are views into one huge-page arena (runner/huge_pages.py),
    which also holds the 16-bit originals a quantized model keeps aside."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        key = (t.data_ptr(), t.nbytes)
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


def weights_bytes(model: nn.Module) -> int:
    """Bytes of parameters and persistent buffers, each counted once, plus the oneDNN-packed copies of
    Linear weights (engine/models/layers/linear.py)."""
    tensors = [t for _, t in model.named_parameters()] + [b for _, b in model.named_buffers(remove_duplicate=True)]
    return unique_tensor_bytes(tensors) + sum(m.packed_bytes() for m in model.modules() if hasattr(m, "packed_bytes"))


class DeviceMemory:
    """(total, free, source) of one device, and this process's bytes on it. On a GPU NVML is initialised
    once (here, not per snapshot) and the device found by its UUID, else its PCI bus id, as torch sees
    it: an NVML index counts every GPU of the machine, torch's only those CUDA_VISIBLE_DEVICES lets
    through (and in its order), so "cuda:0" may be NVML's GPU 3. Without NVML, torch.cuda answers."""

    def __init__(self, device: torch.device, nvml=None) -> None:
        self.device = device
        self._nvml, self._handle = None, None
        if device.type == "cuda":
            self._nvml, self._handle = _nvml_handle(device, nvml)

    def info(self) -> tuple[int, int, str]:
        if self.device.type != "cuda":
            return _host_memory() + ("budget",)
        if self._handle is not None:
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
                return int(mem.total), int(mem.free), "nvml"
            except Exception:  # noqa: BLE001 (NVML went away: torch.cuda still knows)
                pass
        free, total = torch.cuda.mem_get_info(self.device)
        return int(total), int(free), "torch.cuda"

    def process_bytes(self) -> int:
        """This process's memory: on a GPU what torch's caching allocator holds (other processes'
        memory is never counted as the engine's), on the CPU its resident set."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_reserved(self.device))
        return process_resident_bytes()


def nvml_ids(device: torch.device) -> tuple[str | None, str | None]:
    """(UUID as NVML spells it, 'GPU-...'; PCI bus id 'dddddddd:bb:dd.0') of a torch CUDA device."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    uuid = None if uuid is None else str(uuid)
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    bus = None
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return uuid, bus


def _nvml_handle(device: torch.device, nvml=None):
    """(the NVML module, the device's handle), or (None, None) when NVML cannot say which it is."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 (no driver library, no permission: torch.cuda answers instead)
        return None, None
    uuid, bus = nvml_ids(device)
    for lookup, key in ((getattr(nvml, "nvmlDeviceGetHandleByUUID", None), uuid),
                        (getattr(nvml, "nvmlDeviceGetHandleByPciBusId", None), bus)):
        if lookup is None or key is None:
            continue
        try:
            return nvml, lookup(key.encode() if isinstance(key, str) else key)
        except Exception:  # noqa: BLE001 (not found this way: try the next)
            continue
    return None, None


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


def snapshot(memory: DeviceMemory, weights: int, kv_block_bytes: int, blocks_total: int, blocks_used: int,
             blocks_cached: int, activation_bytes: int, packed_weights: int = 0, lora_device: int = 0,
             lora_host: int = 0, graphs: int | None = None, activation_peak: int | None = None) -> MemorySnapshot:
    """`graphs`: the captured decode graphs' bytes (measured; 0 on the CPU, where nothing is captured), None
    with graphs off. `activation_peak`: a step's measured peak (the GPU's start-up profile), None elsewhere:
    where given, the activations' share of the device (the allocator keeps what the peak step freed)."""
    device = memory.device
    total, free, source = memory.info()
    kv_total = kv_block_bytes * blocks_total
    used = memory.process_bytes()  # on a GPU: what remains of total - free is other processes' and the driver's
    # on the CPU the host copies of LoRA adapters live in the same memory
    lora = lora_device + (lora_host if device.type != "cuda" else 0)
    other = max(0, used - weights - kv_total - (activation_peak or activation_bytes) - lora - (graphs or 0))
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
        graphs_bytes=graphs,
        activation_peak_bytes=activation_peak,
    )
