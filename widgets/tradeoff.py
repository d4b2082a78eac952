"""TradeoffPanel: measured configurations on a speed / cost / quality plot.

x: tokens/s per user (measured); y: $ per million tokens, from the measured total tokens/s and an
editable price per GPU-hour; colour: perplexity delta vs 16-bit (measured). A point whose quality was
not measured is drawn hollow and says so; nothing is interpolated.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QDoubleSpinBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.events import TradeoffPoint
from widgets.overlay import Overlay
from widgets.panel_base import Panel
from widgets.theme import blend, style_plot

DEFAULT_PRICE_PER_HOUR = 2.50
QUALITY_BAD_PCT = 10.0  # perplexity delta drawn fully red
NOT_MEASURED = "quality not measured"
_GOOD, _MID, _BAD = QColor("#59a14f"), QColor("#edc948"), QColor("#e15759")


def cost_per_million_tokens(price_per_hour: float, total_tokens_per_s: float) -> float | None:
    """$ per 1M tokens = price per hour / tokens per hour * 1e6 (None without throughput)."""
    if total_tokens_per_s <= 0:
        return None
    return price_per_hour / (total_tokens_per_s * 3600.0) * 1e6


def quality_color(delta_pct: float) -> QColor:
    """Green at 0% perplexity increase, yellow at half of QUALITY_BAD_PCT, red from QUALITY_BAD_PCT."""
    t = min(1.0, max(0.0, delta_pct / QUALITY_BAD_PCT))
    return blend(_GOOD, _MID, 2 * t) if t < 0.5 else blend(_MID, _BAD, 2 * t - 1)


class TradeoffPanel(Panel):
    sigSweep = Signal()
    sigPriceChanged = Signal(float)  # $ per GPU-hour

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._points: dict[str, TradeoffPoint] = {}
        self._current: str | None = None
        self._labels: dict[str, pg.TextItem] = {}

        self._price = QDoubleSpinBox()
        self._price.setRange(0.0, 1000.0)
        self._price.setDecimals(2)
        self._price.setSingleStep(0.1)
        self._price.setPrefix("$ ")
        self._price.setSuffix(" / GPU-hour")
        self._price.setValue(DEFAULT_PRICE_PER_HOUR)
        self._price.valueChanged.connect(self._on_price_changed)
        self._sweep = QPushButton("Run sweep")
        self._sweep.clicked.connect(self.sigSweep)
        self._legend = QLabel()
        self._legend.setWordWrap(True)  # a long legend wraps instead of widening the panel
        self._legend.setTextFormat(Qt.TextFormat.RichText)

        self._plot = pg.PlotWidget()
        p = self._plot.getPlotItem()
        p.setLabel("bottom", "tokens/s per user (measured)")
        p.setLabel("left", "$ per 1M tokens")
        p.showGrid(x=True, y=True, alpha=0.25)
        p.hideButtons()
        self._scatter = pg.ScatterPlotItem(size=14, hoverable=True, tip=self._tip)
        self._ring = pg.ScatterPlotItem(size=28, symbol="o", brush=None, pen=pg.mkPen("#fdd663", width=3))
        p.addItem(self._scatter)
        p.addItem(self._ring)
        self._empty = Overlay(self._plot)

        row = QHBoxLayout()
        row.addWidget(QLabel("price"))
        row.addWidget(self._price)
        row.addStretch(1)
        row.addWidget(self._sweep)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(row)
        layout.addWidget(self._plot, 1)
        layout.addWidget(self._legend)
        self._on_palette_changed()
        self.reset()

    # --- setters ------------------------------------------------------------------------------
    def add_point(self, point: TradeoffPoint) -> None:
        """Add a measured point (a point with the same label replaces the earlier measurement)."""
        self._points[point.label] = point
        self._mark_dirty()

    def set_current(self, label: str | None) -> None:
        self._current = label
        self._mark_dirty()

    def set_price_per_hour(self, price: float) -> None:
        self._price.setValue(price)

    def price_per_hour(self) -> float:
        return self._price.value()

    def clear(self) -> None:
        self._points.clear()
        self._current = None
        self._mark_dirty()
        self.flush()

    def reset(self) -> None:
        self.clear()

    def snapshot_data(self) -> dict:
        price = self.price_per_hour()
        points = [{"label": p.label, "tokens_per_s_per_user": p.tokens_per_s_per_user,
                   "total_tokens_per_s": p.total_tokens_per_s,
                   "cost_per_million_tokens": cost_per_million_tokens(price, p.total_tokens_per_s),
                   "perplexity_delta_pct": p.perplexity_delta_pct, "hollow": p.perplexity_delta_pct is None}
                  for p in self._points.values()]
        return {"price_per_hour": price, "points": points, "num_points": len(points),
                "current": self._current, "empty_text": self._empty.text()}

    # --- painting -----------------------------------------------------------------------------
    def _repaint(self) -> None:
        price = self.price_per_hour()
        spots, fg = [], self.palette().color(self.palette().ColorRole.Text)
        xs = [p.tokens_per_s_per_user for p in self._points.values()]
        mid_x = (min(xs) + max(xs)) / 2 if xs else 0.0
        for label in set(self._labels) - set(self._points):
            self._plot.removeItem(self._labels.pop(label))
        for p in self._points.values():
            cost = cost_per_million_tokens(price, p.total_tokens_per_s)
            if cost is None:
                continue
            measured = p.perplexity_delta_pct is not None
            color = quality_color(p.perplexity_delta_pct) if measured else fg
            spots.append({"pos": (p.tokens_per_s_per_user, cost), "data": p.label,
                          "brush": color if measured else None, "pen": pg.mkPen(color, width=2)})
            text = self._labels.get(p.label)
            if text is None:
                text = self._labels[p.label] = pg.TextItem()
                self._plot.addItem(text)
            # labels point inwards so the outermost ones stay inside the plot
            text.setAnchor((1.0, 1.1) if p.tokens_per_s_per_user >= mid_x else (0.0, 1.1))
            text.setText(p.label if measured else f"{p.label}\n({NOT_MEASURED})")
            text.setColor(fg)
            text.setPos(p.tokens_per_s_per_user, cost)
        self._scatter.setData(spots)
        if spots:  # from zero, with headroom: one point alone would get a degenerate auto-range
            self._plot.setXRange(0, max(sp["pos"][0] for sp in spots) * 1.3, padding=0)
            self._plot.setYRange(0, max(sp["pos"][1] for sp in spots) * 1.3, padding=0)
        cur = self._points.get(self._current or "")
        cur_cost = cost_per_million_tokens(price, cur.total_tokens_per_s) if cur else None
        self._ring.setData([cur.tokens_per_s_per_user] if cur_cost is not None else [],
                           [cur_cost] if cur_cost is not None else [])
        self._plot.getPlotItem().setLabel("left", f"$ per 1M tokens (at ${price:.2f}/GPU-h)")
        self._empty.set_text("" if self._points else "No measured points yet — press “Run sweep”.")
        self._update_legend()

    def _tip(self, x: float, y: float, data: object) -> str:
        p = self._points.get(str(data))
        if p is None:
            return ""
        quality = NOT_MEASURED if p.perplexity_delta_pct is None else f"perplexity Δ {p.perplexity_delta_pct:+.2f}%"
        return (f"{p.label}\n{x:.1f} tok/s per user · {p.total_tokens_per_s:.0f} tok/s total\n"
                f"${y:.3f} per 1M tokens\n{quality}")

    def _update_legend(self) -> None:
        chips = " ".join(f"<span style='color:{quality_color(v).name()}'>●</span> {v:g}%"
                         for v in (0, QUALITY_BAD_PCT / 2, QUALITY_BAD_PCT))
        current = f" · <span style='color:#fdd663'>◯</span> current: <b>{self._current}</b>" if self._current else ""
        self._legend.setText(f"colour = perplexity Δ vs 16-bit: {chips}+ · ○ hollow = {NOT_MEASURED}{current}")

    def _on_price_changed(self, value: float) -> None:
        self.sigPriceChanged.emit(value)
        self._mark_dirty()

    def _on_palette_changed(self) -> None:
        style_plot(self._plot, self.palette())
        self._mark_dirty()
