"""The window's panels and their default dock layout: every panel in a dock, in three columns, the
rarer panels tabbed behind the common ones (a preset raises its own; presenter mode arranges from here)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow

from app.gui.panels import Panels
from app.talk.panel_specs import PANEL_BY_NAME

# the panels the arrangement below places by name; any other panel of the table is tabbed behind latency
ARRANGED = frozenset({"controls", "tokens", "memory", "tradeoff", "timeline", "latency", "spec", "quant", "roofline",
                      "lora", "server", "comparison"})


def build_docks(window: QMainWindow, panels: Panels) -> dict[str, QDockWidget]:
    """Put each panel in a dock of `window`, in the default arrangement; returns the docks by name."""
    window.setDockNestingEnabled(True)
    docks: dict[str, QDockWidget] = {}
    for name, panel in panels.items():
        dock = QDockWidget(PANEL_BY_NAME[name].title, window)
        dock.setObjectName(f"dock-{name}")
        dock.setWidget(panel)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                         | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        docks[name] = dock
    d = docks
    # three columns: controls + tradeoff/comparison | tokens + timeline | memory + latency/spec/quant/roofline
    window.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, d["controls"])
    window.splitDockWidget(d["controls"], d["tokens"], Qt.Orientation.Horizontal)
    window.splitDockWidget(d["tokens"], d["memory"], Qt.Orientation.Horizontal)
    window.splitDockWidget(d["controls"], d["tradeoff"], Qt.Orientation.Vertical)
    window.splitDockWidget(d["tokens"], d["timeline"], Qt.Orientation.Vertical)
    window.splitDockWidget(d["memory"], d["latency"], Qt.Orientation.Vertical)
    window.tabifyDockWidget(d["latency"], d["spec"])
    window.tabifyDockWidget(d["latency"], d["quant"])
    window.tabifyDockWidget(d["latency"], d["roofline"])
    window.tabifyDockWidget(d["latency"], d["lora"])
    window.tabifyDockWidget(d["memory"], d["server"])  # an attached server's panel, where its memory is not
    window.tabifyDockWidget(d["tradeoff"], d["comparison"])  # raised by every preset with a [compare]
    for name in [n for n in docks if n not in ARRANGED]:  # a new panel not placed above: behind latency
        window.tabifyDockWidget(d["latency"], d[name])
    d["latency"].raise_()
    d["tradeoff"].raise_()
    d["memory"].raise_()
    window.resizeDocks([d["controls"], d["tokens"], d["memory"]], [400, 640, 560], Qt.Orientation.Horizontal)
    window.resizeDocks([d["controls"], d["tradeoff"]], [430, 530], Qt.Orientation.Vertical)
    window.resizeDocks([d["tokens"], d["timeline"]], [380, 580], Qt.Orientation.Vertical)
    window.resizeDocks([d["memory"], d["latency"]], [470, 490], Qt.Orientation.Vertical)
    return docks
