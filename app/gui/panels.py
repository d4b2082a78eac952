"""The window's panels, typed: one field per row of the PanelSpec table (app/talk/panel_specs.py), so a
misspelt panel is an AttributeError at its first use (and a type checker's error), never a KeyError later.

Names as data (a preset's `panels = [...]`) go through `named()`, checked against the same table.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

from PySide6.QtWidgets import QWidget

from app.talk.knob_defaults import knob_defaults
from app.talk.panel_specs import PANEL_BY_NAME, PANEL_SPECS
from widgets import (
    ControlsPanel,
    LatencyPanel,
    MemoryPanel,
    QuantErrorPanel,
    RooflinePanel,
    SpecPanel,
    TimelinePanel,
    TokenStreamPanel,
    TradeoffPanel,
)
from widgets.comparison import ComparisonPanel
from widgets.lora_panel import LoraPanel
from widgets.server_panel import ServerPanel


@dataclass(frozen=True, slots=True)
class Panels:
    controls: ControlsPanel
    tokens: TokenStreamPanel
    memory: MemoryPanel
    timeline: TimelinePanel
    latency: LatencyPanel
    spec: SpecPanel
    tradeoff: TradeoffPanel
    quant: QuantErrorPanel
    comparison: ComparisonPanel
    roofline: RooflinePanel
    lora: LoraPanel
    server: ServerPanel

    def named(self, name: str) -> QWidget:
        """The panel a preset or a dock names (a name from PANEL_SPECS; KeyError otherwise)."""
        return getattr(self, PANEL_BY_NAME[name].name)

    def items(self) -> Iterator[tuple[str, QWidget]]:
        """(name, panel) in the table's order (the dock order)."""
        return ((spec.name, getattr(self, spec.name)) for spec in PANEL_SPECS)

    def values(self) -> Iterator[QWidget]:
        return (getattr(self, spec.name) for spec in PANEL_SPECS)


if tuple(f.name for f in fields(Panels)) != tuple(spec.name for spec in PANEL_SPECS):  # one table, one order
    raise ImportError("app/gui/panels.py: Panels' fields must be PANEL_SPECS' names, in order")


def make_panels() -> Panels:
    return Panels(controls=ControlsPanel(defaults=knob_defaults()),
                  tokens=TokenStreamPanel(max_streams=16), memory=MemoryPanel(), timeline=TimelinePanel(),
                  latency=LatencyPanel(), spec=SpecPanel(), tradeoff=TradeoffPanel(), quant=QuantErrorPanel(),
                  comparison=ComparisonPanel(), roofline=RooflinePanel(), lora=LoraPanel(), server=ServerPanel())
