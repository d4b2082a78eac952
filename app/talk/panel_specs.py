"""The window's panels as one table: each panel's name (what presets write), dock title, and what it needs
from the engine source (capabilities, app/source/engine_info.py).

Qt-free so presets (which name panels) and the GUI (which builds them: app/gui/panels.py) read the same
table. A panel whose need the source does not declare is greyed out with a message (the controller), and a
preset that shows it asks for the embedded engine (preset_actions).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class PanelSpec:
    name: str  # the Panels field, the dock's object name, what a preset's `panels = [...]` lists
    title: str  # the dock's title ("&&": a literal "&" in Qt)
    # (capability, what it shows): greyed out with a message when the source lacks one
    needs: tuple[tuple[str, str], ...] = ()
    in_presets: bool = True  # False: shown by the app itself (the attached server's panel), not by a preset


PANEL_SPECS: tuple[PanelSpec, ...] = (
    PanelSpec("controls", "Controls"),
    PanelSpec("tokens", "Token stream"),
    PanelSpec("memory", "Memory", (("memory_breakdown", "the memory breakdown (weights / KV bytes)"),
                                   ("block_map", "the KV block map"))),
    PanelSpec("timeline", "Batch && queue timeline", (("step_events", "per-step batch composition and queue events"),)),
    PanelSpec("latency", "Latency"),
    PanelSpec("spec", "Speculative decoding", (("speculative", "speculative decoding per step"),)),
    PanelSpec("tradeoff", "Speed · cost · quality",
              (("sweep", "the tradeoff sweep and its per-step measured points"),)),
    PanelSpec("quant", "Quantization error", (("quantization", "weight quantization"),)),
    PanelSpec("comparison", "Measured comparison",
              (("sweep", "measured comparisons (they run the embedded engine)"),)),
    PanelSpec("roofline", "Roofline", (("step_events", "per-step FLOPs and bytes (the roofline)"),)),
    PanelSpec("lora", "LoRA adapters", (("lora", "multi-LoRA serving"),)),
    PanelSpec("server", "Server (/metrics)", (("server_metrics", "an attached server's /metrics"),), in_presets=False),
)
PANEL_BY_NAME = MappingProxyType({spec.name: spec for spec in PANEL_SPECS})
PANEL_NAMES = tuple(spec.name for spec in PANEL_SPECS if spec.in_presets)  # what a preset may name
