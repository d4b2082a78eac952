"""The knobs' starting values and slider stops, from where each one is defined: the engine's knobs from
its knob table (engine/knobs.py), the arrival rate from LoadConfig's, the burst size and latency budget
from a preset's. The controller starts from these and hands them to the controls panel as data."""
from __future__ import annotations

from dataclasses import fields

from app.load.generator import LoadConfig
from app.talk.presets import Preset
from engine.events import KvCacheDtype
from engine.knobs import KNOB
from engine.quant_formats import QUANT_BITS

ENGINE_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "policy", "compile",
                "quant_bits", "num_speculative_tokens")


def engine_knob_defaults() -> dict:
    # the KV cache knob in bits: 16 (the model's dtype) or 8 (kv_cache_dtype="int8")
    return {**{k: KNOB[k].default for k in ENGINE_KNOBS},
            "kv_cache_bits": kv_cache_bits(KNOB["kv_cache_dtype"].default)}


def knob_stops() -> dict:
    """The slider stops of the engine's knobs that are a range or a list in the table (the controls panel
    keeps its own finer choices, such as the token budget's, within them)."""
    def span(name: str) -> range:
        knob = KNOB[name]
        low, high = knob.app_range or (knob.low, knob.high)
        return range(int(low), int(high) + 1)

    return {"max_num_seqs": span("max_num_seqs"), "num_speculative_tokens": span("num_speculative_tokens"),
            "quant_bits": QUANT_BITS}


def kv_cache_bits(kv_cache_dtype: KvCacheDtype) -> int:
    return 8 if kv_cache_dtype == KvCacheDtype.INT8 else 16


def kv_cache_dtype(bits: int) -> KvCacheDtype:
    return KvCacheDtype.INT8 if bits == 8 else KvCacheDtype.AUTO


def knob_defaults() -> dict:
    """Every value the controls panel shows, as it starts and after a reset."""
    preset = {f.name: f.default for f in fields(Preset)}
    load = LoadConfig()  # the Load generator's rows: the arrival rate and what each request samples with
    return {**engine_knob_defaults(), "arrival_rate": load.arrival_rate, **load.sampling(),
            "burst_size": preset["burst_size"], "ttft_budget_s": preset["ttft_s"], "tpot_budget_s": preset["tpot_s"]}
