"""SpecPanel: speculative decoding acceptance, per draft position, tokens per step, speed-up.

Everything is measured from SpecDecodeStats except the speed-up the engine's cost model predicts,
which is always labelled "predicted". With speculation off (method None, or no stats yet) the panel
shows an overlay saying so and draws nothing underneath.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from engine.events import SpecDecodeStats, TokenSource
from widgets.panel_base import Panel
from widgets.theme import PHASE_COLORS, TOKEN_SOURCE_COLORS, style_plot

DEFAULT_WINDOW_STEPS = 50  # the rolling window of the acceptance numbers
OFF_TEXT = "Speculative decoding: off"
_ACCEPT = TOKEN_SOURCE_COLORS["dark"][TokenSource.ACCEPTED]


def _plot(title: str, y_label: str) -> pg.PlotWidget:
    w = pg.PlotWidget()
    p = w.getPlotItem()
    p.setTitle(title)
    p.setLabel("left", y_label)
    p.showGrid(x=False, y=True, alpha=0.25)
    p.setMouseEnabled(x=False, y=False)
    p.hideButtons()
    return w


def rolling_ratio(num: np.ndarray, den: np.ndarray, window: int) -> np.ndarray:
    """sum(num[i-window+1..i]) / sum(den[...]) for every i (0 where the window has no drafts)."""
    cn, cd = np.cumsum(num, dtype=np.float64), np.cumsum(den, dtype=np.float64)
    cn[window:] = cn[window:] - cn[:-window].copy()
    cd[window:] = cd[window:] - cd[:-window].copy()
    return np.divide(cn, cd, out=np.zeros_like(cn), where=cd > 0)


class SpecPanel(Panel):
    def __init__(self, parent: QWidget | None = None, window_steps: int = DEFAULT_WINDOW_STEPS,
                 max_steps: int = 600) -> None:
        super().__init__(parent)
        self._window = window_steps
        self._stats: deque[SpecDecodeStats] = deque(maxlen=max_steps)
        self._method: str | None = None
        self._measured: float | None = None
        self._compared: tuple[float, str] | None = None  # (speed-up, where from): the chapter's comparison

        self._summary = QLabel()
        self._summary.setTextFormat(Qt.TextFormat.RichText)
        self._summary.setWordWrap(True)  # a long summary wraps instead of widening the panel past a projector
        self._rate_plot = _plot(f"acceptance rate (rolling {window_steps} steps)", "%")
        self._pos_plot = _plot("acceptance per draft position", "%")
        self._tps_plot = _plot("tokens per verify pass (per request)", "tokens")
        self._speed_plot = _plot("speed-up vs plain decoding", "×")
        self._rate_curve = self._rate_plot.plot([], [], pen=pg.mkPen(_ACCEPT, width=2))
        self._tps_curve = self._tps_plot.plot([], [], pen=pg.mkPen(PHASE_COLORS["verify"], width=2))
        self._pos_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=_ACCEPT)
        self._pos_plot.addItem(self._pos_bars)
        self._pos_plot.setYRange(0, 100)
        self._rate_plot.setYRange(0, 100)
        self._speed_bars = pg.BarGraphItem(x=[0, 1], height=[0, 0], width=0.6,
                                           brushes=[PHASE_COLORS["queued"], PHASE_COLORS["decode"]])
        self._speed_plot.addItem(self._speed_bars)
        self._speed_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#9e9e9e", style=Qt.PenStyle.DashLine)))
        self._speed_plot.getPlotItem().getAxis("bottom").setTicks([[(0, "predicted"), (1, "measured")]])
        self._speed_plot.setXRange(-0.6, 1.6)
        self._speed_text = [pg.TextItem(anchor=(0.5, 1.0)) for _ in range(2)]
        for i, t in enumerate(self._speed_text):
            t.setPos(i, 0)
            self._speed_plot.addItem(t)

        grid = QGridLayout()
        for i, w in enumerate((self._rate_plot, self._pos_plot, self._tps_plot, self._speed_plot)):
            grid.addWidget(w, i // 2, i % 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._summary)
        layout.addLayout(grid, 1)
        self._on_palette_changed()
        self.reset()

    # --- setters ------------------------------------------------------------------------------
    def add_spec_stats(self, stats: SpecDecodeStats) -> None:
        self._method = stats.method
        if stats.method is not None and stats.num_verify_passes > 0:
            self._stats.append(stats)
        self._mark_dirty()

    def set_measured_speedup(self, speedup: float | None) -> None:
        self._measured = speedup
        self._mark_dirty()

    def set_compared_speedup(self, speedup: float | None, source: str = "") -> None:
        """The speed-up the chapter's comparison measured side by side (kept through resets; shown while
        no live speed-up has been measured in this session)."""
        self._compared = (speedup, source) if speedup is not None else None
        self._mark_dirty()

    def reset(self) -> None:
        self._stats.clear()
        self._method = None
        self._measured = None
        self._mark_dirty()
        self.flush()

    def snapshot_data(self) -> dict:
        m = self._metrics()
        return {"method": self._method, "off": self._method is None, "num_steps": len(self._stats),
                "overlay": self.overlay_text(), **m}

    # --- derived numbers ----------------------------------------------------------------------
    def _metrics(self) -> dict:
        stats = list(self._stats)
        if not stats:
            return {"acceptance_rate": None, "per_position": [], "tokens_per_step": None, "draft_length": None,
                    "predicted_speedup": None, "measured_speedup": self._measured, "measured_source": None}
        recent = stats[-self._window:]
        k = max((len(s.drafted_per_position) for s in recent), default=0)
        acc, drf = np.zeros(k), np.zeros(k)
        for s in recent:
            acc[:len(s.accepted_per_position)] += s.accepted_per_position
            drf[:len(s.drafted_per_position)] += s.drafted_per_position
        drafted = sum(s.num_draft_tokens for s in recent)
        return {
            "acceptance_rate": sum(s.num_accepted_tokens for s in recent) / drafted if drafted else None,
            "per_position": list(np.divide(acc, drf, out=np.zeros(k), where=drf > 0)),
            "tokens_per_step": sum(s.num_emitted_tokens for s in recent) / sum(s.num_verify_passes for s in recent),
            "draft_length": next((s.draft_length for s in reversed(recent) if s.draft_length is not None), None),
            "predicted_speedup": next((s.predicted_speedup for s in reversed(recent)
                                       if s.predicted_speedup is not None), None),
            "measured_speedup": self._measured if self._measured is not None else (
                self._compared[0] if self._compared else None),
            "measured_source": "live" if self._measured is not None else (self._compared[1] if self._compared
                                                                           else None),
        }

    # --- painting -----------------------------------------------------------------------------
    def _off_text(self) -> str:
        return OFF_TEXT if self._method is None or not self._stats else ""

    def _repaint(self) -> None:
        self._update_overlay()
        stats = list(self._stats)
        m = self._metrics()
        x = np.array([s.step for s in stats], dtype=np.float64)
        acc = np.array([s.num_accepted_tokens for s in stats], dtype=np.float64)
        drf = np.array([s.num_draft_tokens for s in stats], dtype=np.float64)
        emitted = np.array([s.num_emitted_tokens for s in stats], dtype=np.float64)
        passes = np.array([s.num_verify_passes for s in stats], dtype=np.float64)
        self._rate_curve.setData(x, 100 * rolling_ratio(acc, drf, self._window))
        self._tps_curve.setData(x, rolling_ratio(emitted, passes, self._window))
        per_pos = np.array(m["per_position"]) * 100
        self._pos_bars.setOpts(x=np.arange(1, len(per_pos) + 1), height=per_pos)
        self._pos_plot.getPlotItem().getAxis("bottom").setTicks(
            [[(i, str(i)) for i in range(1, len(per_pos) + 1)]])
        speeds = (m["predicted_speedup"], m["measured_speedup"])
        self._speed_bars.setOpts(height=[v or 0.0 for v in speeds])
        # the figures under their bars too: a short plot (the compact window) has no room above a bar for two
        # lines of text, which then ran into the plot's title; there the labels above the bars are hidden
        vb = self._speed_plot.getPlotItem().vb
        room = vb.height() > 5 * self.fontMetrics().height()
        # a bar's share of the axis; too narrow for "predicted 2.26×", the figures alone (in the bars' order,
        # predicted then measured, as the summary line above says them)
        wide = vb.width() / 2.2 > self.fontMetrics().horizontalAdvance("predicted 0.00× ") * 1.1
        ticks = []
        for i, (item, name, v) in enumerate(zip(self._speed_text, ("predicted", "measured"), speeds)):
            item.setText(f"{name}\n{v:.2f}×" if v is not None else f"{name}\nn/a")
            item.setPos(item.pos().x(), v or 0.0)
            item.setVisible(room)
            figure = f"{v:.2f}×" if v is not None else "n/a"
            ticks.append((i, name if room else f"{name} {figure}" if wide else figure))
        self._speed_plot.getPlotItem().getAxis("bottom").setTicks([ticks])
        self._speed_plot.setYRange(0, max(2.0, *(v or 0.0 for v in speeds)) * 1.25)
        self._summary.setText(self._summary_text(m))

    def _summary_text(self, m: dict) -> str:
        if self._method is None or not self._stats:
            return f"<b>{OFF_TEXT}</b>"
        rate = "—" if m["acceptance_rate"] is None else f"{100 * m['acceptance_rate']:.0f}%"
        pred = "n/a" if m["predicted_speedup"] is None else f"{m['predicted_speedup']:.2f}×"
        meas = "n/a" if m["measured_speedup"] is None else f"{m['measured_speedup']:.2f}×"
        if m["measured_speedup"] is not None and m["measured_source"] not in (None, "live"):
            meas += f" ({m['measured_source']})"
        k = len(m["per_position"]) if m["draft_length"] is None else m["draft_length"]  # the engine's latest choice
        return (f"<b>Speculative decoding: {self._method}</b>, k = {k} · acceptance <b>{rate}</b> · "
                f"<b>{m['tokens_per_step']:.2f}</b> tokens per verify pass · speed-up "
                f"<i>predicted</i> {pred} · measured <b>{meas}</b>")

    def _on_palette_changed(self) -> None:
        fg = self.palette().color(self.palette().ColorRole.Text)
        for plot in (self._rate_plot, self._pos_plot, self._tps_plot, self._speed_plot):
            style_plot(plot, self.palette())
        for item in self._speed_text:
            item.setColor(fg)
