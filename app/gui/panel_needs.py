"""What each panel needs from the engine source: the capabilities (app/source/engine_info.py) it shows.

A panel whose need the source does not declare is greyed out with a message (the controller) and a preset
that shows it asks for the embedded engine (preset_actions). Its own module so both read it without a cycle.
"""
from __future__ import annotations

PANEL_NEEDS = {  # panel -> ((capability, what it shows), ...): greyed out with a message when one is missing
    "memory": (("memory_breakdown", "the memory breakdown (weights / KV bytes)"), ("block_map", "the KV block map")),
    "timeline": (("step_events", "per-step batch composition and queue events"),),
    "spec": (("speculative", "speculative decoding per step"),),
    "quant": (("quantization", "weight quantization"),),
    "roofline": (("step_events", "per-step FLOPs and bytes (the roofline)"),),
    "tradeoff": (("sweep", "the tradeoff sweep and its per-step measured points"),),
    "comparison": (("sweep", "measured comparisons (they run the embedded engine)"),),
    "server": (("server_metrics", "an attached server's /metrics"),),
    "lora": (("lora", "multi-LoRA serving"),),
}
