"""The window's panels and their default dock layout: every panel in a dock, in three columns, the
rarer panels tabbed behind the common ones (a preset raises its own; presenter mode arranges from here).
The compact arrangement (a screen of fewer than ~900 lines: a laptop, a 1280 x 720 projector) keeps the
measured comparison on screen on the left, never in a tab behind another panel a preset raises, the
charts full height in the middle, and the controls scrollable under the comparison."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QFrame, QMainWindow, QScrollArea, QTabBar

from app.gui.panels import Panels
from app.talk.panel_specs import PANEL_BY_NAME

# the panels the arrangement below places by name; any other panel of the table is tabbed behind latency
ARRANGED = frozenset({"controls", "tokens", "memory", "tradeoff", "timeline", "latency", "spec", "quant", "roofline",
                      "lora", "server", "comparison"})


# rows of text and sliders: in the compact window they scroll rather than set the window's height
SCROLLED_WHEN_COMPACT = ("controls", "server", "lora", "memory")


def build_docks(window: QMainWindow, panels: Panels, compact: bool = False) -> dict[str, QDockWidget]:
    """Put each panel in a dock of `window`, in the default (or compact) arrangement; returns the docks by
    name."""
    window.setDockNestingEnabled(True)
    docks: dict[str, QDockWidget] = {}
    for name, panel in panels.items():
        dock = QDockWidget(PANEL_BY_NAME[name].title, window)
        dock.setObjectName(f"dock-{name}")
        dock.setWidget(_scrolled(panel) if compact and name in SCROLLED_WHEN_COMPACT else panel)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                         | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        docks[name] = dock
    if compact:
        _arrange_compact(window, docks)
        return docks
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


def _scrolled(panel):
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidget(panel)
    return area


def _arrange_compact(window: QMainWindow, d: dict[str, QDockWidget]) -> None:
    """comparison over controls | timeline, tokens, tradeoff (tabs) | memory over latency (tabs): about
    580 lines of docks under a two-line caption on a 720-line screen."""
    left = Qt.DockWidgetArea.LeftDockWidgetArea
    for dock in d.values():  # every dock in the layout first: a tab group made of docks outside it left
        window.addDockWidget(left, dock)  # stale tab bars on screen (a second "Latency" bar)
    window.splitDockWidget(d["comparison"], d["timeline"], Qt.Orientation.Horizontal)
    window.splitDockWidget(d["timeline"], d["memory"], Qt.Orientation.Horizontal)
    window.splitDockWidget(d["comparison"], d["controls"], Qt.Orientation.Vertical)
    window.splitDockWidget(d["memory"], d["latency"], Qt.Orientation.Vertical)
    for tab in ("tokens", "tradeoff"):  # the middle column's charts take its whole height when raised
        window.tabifyDockWidget(d["timeline"], d[tab])
    for tab in ("spec", "quant", "roofline", "lora"):
        window.tabifyDockWidget(d["latency"], d[tab])
    window.tabifyDockWidget(d["memory"], d["server"])
    for name in [n for n in d if n not in ARRANGED]:
        window.tabifyDockWidget(d["latency"], d[name])
    for name in ("timeline", "latency", "memory"):
        d[name].raise_()


def size_compact(window: QMainWindow, d: dict[str, QDockWidget]) -> None:
    """The compact columns' shares of the window (once it has its size): the comparison ~37 % wide and
    three fifths of its column's height."""
    w, h = window.width(), window.height()
    window.resizeDocks([d["comparison"], d["timeline"], d["memory"]], [int(w * 0.37), int(w * 0.35), int(w * 0.28)],
                       Qt.Orientation.Horizontal)
    window.resizeDocks([d["comparison"], d["controls"]], [int(h * 0.6), int(h * 0.4)], Qt.Orientation.Vertical)
    window.resizeDocks([d["memory"], d["latency"]], [int(h * 0.5), int(h * 0.5)], Qt.Orientation.Vertical)


def hide_stale_tab_bars(window: QMainWindow) -> None:
    """Hide tab bars Qt left on screen from an earlier arrangement (a second "Latency | Speculative" bar
    over the controls after the compact arrangement was built): a live bar sits right under one of its
    docks; one that sits under none of them belongs to no tab group any more."""
    docks = {d.windowTitle().removeprefix("★ "): d for d in window.findChildren(QDockWidget)}
    for bar in window.findChildren(QTabBar):
        if bar.parentWidget() is not window or not bar.isVisible():
            continue
        titles = [bar.tabText(i).replace("&&", "&").removeprefix("★ ") for i in range(bar.count())]
        under = [docks[t] for t in titles if t in docks and docks[t].isVisible()]
        g = bar.geometry()
        if not any(abs(d.geometry().bottom() + 1 - g.top()) <= 3 and abs(d.geometry().left() - g.left()) <= 3
                   for d in under):
            bar.hide()
        bar.setElideMode(Qt.TextElideMode.ElideNone)  # whole names ("★ Latency", not "★..."); arrows scroll
        bar.setUsesScrollButtons(True)
