"""The engine's LoRA part, made from its config: nothing at all with max_loras=0 (no wrappers in the
model, no cost), else the wrappers and a pool of max_loras device slots."""
from __future__ import annotations

import torch
from torch import nn

from engine.config import EngineConfig
from engine.lora.modules import LoraModules, pool_bytes
from engine.lora.pool import LoraPool
from engine.models.model_config import ModelConfig


def reserved_bytes(config: EngineConfig, mc: ModelConfig, device: torch.device, dtype: torch.dtype) -> int:
    """Device bytes the pool's slots will take (the KV budget leaves them out)."""
    return pool_bytes(mc, config.max_loras, config.max_lora_rank, device, dtype) if config.max_loras else 0


def require_pool(pool: LoraPool | None) -> LoraPool:
    if pool is None:
        raise ValueError("this engine has no LoRA pool: start it with EngineConfig(max_loras=N)")
    return pool


def build_pool(model: nn.Module, mc: ModelConfig, config: EngineConfig, device: torch.device,
               dtype: torch.dtype) -> LoraPool | None:
    if not config.max_loras:
        return None
    modules = LoraModules(model, mc, config.max_loras, config.max_lora_rank, device, dtype)
    max_cpu = config.max_loras if config.max_cpu_loras is None else config.max_cpu_loras
    return LoraPool(modules, mc, config.max_loras, max_cpu, config.max_lora_rank, dtype)
