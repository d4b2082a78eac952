"""Engine set-up decisions: device, dtype, and how many KV blocks the memory budget buys."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.events import KernelBuild, KvCacheDtype
from engine.models.layers.kv_quant import kv_row_bytes
from engine.models.model_config import ModelConfig
from engine.runner.cpu_compute import plan_compute

DEVICE_ENV = "INFERLAB_DEVICE"  # what device "auto" means when set (the test suite pins "cpu")
CPU_KV_CACHE_BYTES = 512 * 2**20  # the CPU's KV budget when none is given


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device {name!r} is not a device torch knows (cpu, cuda, cuda:1, ...): {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} was asked for but torch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        if device.index is None:  # one name for one device: memory queries and NVML look it up by index
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype weights and KV are stored in (engine/runner/cpu_compute.py decides, and why)."""
    return plan_compute(name, device).dtype


def kv_block_bytes(mc: ModelConfig, block_size: int, dtype: torch.dtype,
                   kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO) -> int:
    """Bytes of one block: K and V for block_size tokens across every layer (int8: values + row scales)."""
    row = kv_row_bytes(mc.head_dim, torch.empty((), dtype=dtype).element_size(), kv_cache_dtype == KvCacheDtype.INT8)
    return block_size * 2 * mc.num_hidden_layers * mc.num_key_value_heads * row


@dataclass(slots=True)
class KvSizing:
    """How the KV cache was sized, each measurement in the order it ran: "profile" (a worst-case step's
    peak, GPU only), "graphs" (the start-up decode graphs' bytes, EngineConfig.cuda_graphs; 0 on the CPU,
    where nothing is captured), "kv" (the blocks bought with what was left)."""

    steps: list[str] = field(default_factory=list)
    peak_step_bytes: int = 0
    graphs_bytes: int = 0


def num_kv_blocks(config: EngineConfig, device: torch.device, block_bytes: int, weights_bytes: int = 0,
                  weights_saved: int = 0, reserved_bytes: int = 0,
                  profile_peak: Callable[[], int] | None = None,
                  profile_graphs: Callable[[], int] | None = None, sizing: KvSizing | None = None) -> int:
    """Blocks the budget buys (kv_budget_bytes); `block_bytes` is what one block costs across every
    cache that holds it (the target's, plus a draft model's of the same block count). `reserved_bytes`
    (the LoRA pool's slots, allocated after this) comes off every budget; `profile_graphs` (graphs on)
    measures the start-up graphs, whose bytes come off every budget but an explicit KV one. `sizing`
    records what was measured, in order."""
    sizing = sizing if sizing is not None else KvSizing()
    if config.num_kv_blocks is not None:
        sizing.steps.append("kv")
        return check_fits(config.num_kv_blocks, block_bytes, device)
    budget = kv_budget_bytes(config, device, weights_bytes, weights_saved, profile_peak, profile_graphs, sizing)
    sizing.steps.append("kv")
    blocks = (budget - reserved_bytes) // block_bytes
    if blocks < 1:
        pool = f" after the LoRA pool's {reserved_bytes} bytes (fewer max_loras or a lower max_lora_rank)" \
            if reserved_bytes else ""
        raise ValueError(f"the KV cache budget ({budget} bytes) holds no block of {block_bytes} bytes{pool}")
    return check_fits(int(blocks), block_bytes, device)


def kv_budget_bytes(config: EngineConfig, device: torch.device, weights_bytes: int, weights_saved: int,
                    profile_peak: Callable[[], int] | None = None,
                    profile_graphs: Callable[[], int] | None = None, sizing: KvSizing | None = None) -> int:
    """Bytes the KV cache may take. Explicit budgets rule on every device: a whole-memory budget
    (memory_budget_bytes) less the weights (and the graphs), else a KV budget (kv_cache_memory_bytes,
    sized for 16-bit weights) plus what quantization took off them (`weights_saved`). With neither: on a
    GPU what a profiled step and the start-up graphs leave (gpu_kv_budget), on the CPU 512 MiB
    (+ weights_saved; graphs measure 0 bytes there). The order is vLLM's: profile, graphs, then KV."""
    sizing = sizing if sizing is not None else KvSizing()
    if config.kv_cache_memory_bytes is not None and config.memory_budget_bytes is None:
        return config.kv_cache_memory_bytes + weights_saved
    if device.type == "cuda" and config.memory_budget_bytes is None:
        torch.cuda.empty_cache()  # the 16-bit weights that quantization replaced
        if profile_peak is not None:
            sizing.peak_step_bytes = profile_peak()
            sizing.steps.append("profile")
    if profile_graphs is not None:
        sizing.graphs_bytes = profile_graphs()
        sizing.steps.append("graphs")
    if config.memory_budget_bytes is not None:
        return config.memory_budget_bytes - weights_bytes - sizing.graphs_bytes
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the throwaway cache and graphs the measurements freed
        free, total = torch.cuda.mem_get_info(device)
        return gpu_kv_budget(total, free, config.gpu_memory_utilization, sizing.peak_step_bytes) - sizing.graphs_bytes
    return CPU_KV_CACHE_BYTES + weights_saved - sizing.graphs_bytes


def gpu_kv_budget(total: int, free: int, utilization: float, peak_step_bytes: int) -> int:
    """vLLM / nano-vllm sizing: the utilisation target, less what is in use now (weights loaded; other
    processes' memory included, as it really is taken), less the peak a worst-case step allocates on
    top (measured by a warm-up; engine/runner/profile.py)."""
    return int(total * utilization) - (total - free) - peak_step_bytes


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can take now on `device` (Linux MemAvailable on the CPU), or None when
    the platform does not say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(blocks: int, block_bytes: int, device: torch.device) -> int:
    """`blocks`, or a ValueError when their KV cache cannot fit the memory available: fail at once
    with the sizes rather than later (on Linux, torch.zeros of a huge size can even succeed lazily and
    end in the OOM killer once the pages are touched)."""
    need, available = blocks * block_bytes, available_memory_bytes(device)
    if available is not None and need > available:
        raise ValueError(f"a KV cache of {blocks} blocks needs {need / 2**30:.1f} GiB but only "
                         f"{available / 2**30:.1f} GiB of {device.type} memory is available; use fewer KV blocks")
    return blocks


def kv_blocks_after_requant(config: EngineConfig, base_blocks: int, base_weights: int, weights_now: int,
                            block_bytes: int) -> int:
    """After a runtime requantization: the blocks the engine started with, plus (or minus) what the
    change in weight bytes buys at the same total memory (`block_bytes`: one block across every cache
    of that block count). A fixed `num_kv_blocks` never changes."""
    if config.num_kv_blocks is not None:
        return base_blocks
    return max(1, base_blocks + (base_weights - weights_now) // block_bytes)


def stream_kernel_for(config: EngineConfig, device: torch.device, dtype: torch.dtype, progress=None):
    """The native weight-streaming linear module where it applies (EngineConfig.stream_linear, bf16 on
    the CPU), built once per machine; None elsewhere or where it cannot be built (then the library's
    kernels run, after one warning)."""
    if not config.stream_linear or device.type != "cpu" or dtype != torch.bfloat16:
        return None
    from engine.kernels import stream_linear_kernel
    from engine.kernels.tier_choice import family_for_format

    return stream_linear_kernel(progress, wait=config.kernel_build == KernelBuild.WAIT,
                                family=family_for_format(config.quant_format))
