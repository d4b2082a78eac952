"""Engine set-up decisions: device, dtype, and how many KV blocks the memory budget buys."""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.models.layers.kv_quant import kv_row_bytes
from engine.models.model_config import ModelConfig

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    # bf16 by default everywhere: on the CPU it runs on AMX and halves the bytes read per token.
    return torch.bfloat16 if name == "auto" else _DTYPES[name]


def kv_block_bytes(mc: ModelConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """Bytes of one block: K and V for block_size tokens across every layer (int8: values + row scales)."""
    row = kv_row_bytes(mc.head_dim, torch.empty((), dtype=dtype).element_size(), kv_cache_dtype == "int8")
    return block_size * 2 * mc.num_hidden_layers * mc.num_key_value_heads * row


def num_kv_blocks(config: EngineConfig, device: torch.device, block_bytes: int, weights_bytes: int = 0,
                  weights_saved: int = 0, reserved_bytes: int = 0) -> int:
    """Blocks the budget buys. `weights_saved` (bytes quantization took off the 16-bit weights) goes to
    KV on every path: the device's free memory already shows it, a whole-memory budget subtracts the
    smaller weights, and the CPU's KV budget (sized for 16-bit weights) gets it added. `reserved_bytes`
    (the LoRA pool's slots, allocated after this) comes off every budget."""
    if config.num_kv_blocks is not None:
        return check_fits(config.num_kv_blocks, block_bytes, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the 16-bit weights that quantization replaced
        free, total = torch.cuda.mem_get_info(device)
        # What the utilisation target leaves after what is already in use (weights are loaded by now),
        # minus a reserve for activations.
        budget = int(total * config.gpu_memory_utilization) - (total - free) - 512 * 2**20
    elif config.memory_budget_bytes is not None:
        budget = config.memory_budget_bytes - weights_bytes
    else:
        budget = config.kv_cache_memory_bytes + weights_saved
    blocks = (budget - reserved_bytes) // block_bytes
    if blocks < 1:
        pool = f" after the LoRA pool's {reserved_bytes} bytes (fewer max_loras or a lower max_lora_rank)" \
            if reserved_bytes else ""
        raise ValueError(f"the KV cache budget ({budget} bytes) holds no block of {block_bytes} bytes{pool}")
    return check_fits(int(blocks), block_bytes, device)


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
    change in weight bytes buys at the same total memory. A fixed `num_kv_blocks` never changes."""
    if config.num_kv_blocks is not None:
        return base_blocks
    return max(1, base_blocks + (base_weights - weights_now) // block_bytes)


def stream_kernel_for(config: EngineConfig, device: torch.device, dtype: torch.dtype, progress=None):
    """The native weight-streaming linear module where it applies (EngineConfig.stream_linear, bf16 on
    the CPU), built once per machine; None elsewhere or where it cannot be built (then the library's
    kernels run, after one warning)."""
    if not config.stream_linear or device.type != "cpu" or dtype != torch.bfloat16:
        return None
    from engine.runner.kernels import stream_linear_kernel

    return stream_linear_kernel(progress)
