"""The knobs' starting values, from where each one is defined: the engine's knobs from EngineConfig's
defaults, the arrival rate from LoadConfig's, the burst size and latency budget from a preset's. The
controller starts from these and hands them to the controls panel as data."""
from __future__ import annotations

from dataclasses import fields

from app.load.generator import LoadConfig
from app.talk.presets import Preset
from engine.config import EngineConfig

ENGINE_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy", "compile",
                "quant_bits", "num_speculative_tokens")


def engine_knob_defaults() -> dict:
    engine = EngineConfig()
    # the KV cache knob in bits: 16 (the model's dtype) or 8 (kv_cache_dtype="int8")
    return {**{k: getattr(engine, k) for k in ENGINE_KNOBS}, "kv_cache_bits": kv_cache_bits(engine.kv_cache_dtype)}


def kv_cache_bits(kv_cache_dtype: str) -> int:
    return 8 if kv_cache_dtype == "int8" else 16


def kv_cache_dtype(bits: int) -> str:
    return "int8" if bits == 8 else "auto"


def knob_defaults() -> dict:
    """Every value the controls panel shows, as it starts and after a reset."""
    preset = {f.name: f.default for f in fields(Preset)}
    return {**engine_knob_defaults(), "arrival_rate": LoadConfig().arrival_rate, "burst_size": preset["burst_size"],
            "ttft_budget_s": preset["ttft_s"], "tpot_budget_s": preset["tpot_s"]}
