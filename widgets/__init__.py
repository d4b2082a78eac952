"""inferlab panels: views over engine events (PySide6, pyqtgraph, numpy; never torch).

Each panel has setters fed by the app, `sig*` signals for what the user asked for, `reset()` and
`snapshot_data()`; data is buffered and repainted on a ~20 Hz timer when it changed.
Call setters on the GUI thread only (the engine host hands events over with a queued signal).
"""
from widgets.block_map import BlockMapView
from widgets.caption import CaptionBanner
from widgets.controls import ControlsPanel
from widgets.gantt import GanttView
from widgets.latency_panel import LatencyPanel
from widgets.memory_bar import MemoryBar
from widgets.memory_panel import MemoryPanel
from widgets.quant_error import QuantErrorPanel
from widgets.roofline import RooflinePanel
from widgets.spec_panel import SpecPanel
from widgets.theme import apply_theme
from widgets.timeline import TimelinePanel
from widgets.token_stream import TokenStreamPanel
from widgets.token_view import TokenView
from widgets.tradeoff import TradeoffPanel

__all__ = [
    "BlockMapView", "CaptionBanner", "ControlsPanel", "GanttView", "LatencyPanel", "MemoryBar",
    "MemoryPanel", "QuantErrorPanel", "RooflinePanel", "SpecPanel", "TimelinePanel", "TokenStreamPanel", "TokenView",
    "TradeoffPanel",
    "apply_theme",
]
