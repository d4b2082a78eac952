"""RooflinePanel: arithmetic intensity (FLOPs / byte, counted) against achieved FLOP/s, log-log, under
the machine's two measured roofs; live dots for prefill and decode steps; a verdict line per kind.

A view: the app hands it the roofs (plain numbers and how they were measured), each step's dot and the
verdict texts. Dots live in ring buffers; curves are created once and repainted with setData.
"""
from __future__ import annotations

import math
from collections import deque

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from widgets.log_axis import set_log_ticks
from widgets.overlay import Overlay
from widgets.panel_base import Panel
from widgets.theme import style_plot

MAX_DOTS = 400  # per kind
KIND_COLORS = {"prefill": "#f28e2b", "decode": "#4e79a7", "verify": "#b07aa1"}
ROOF_COLOR = "#e15759"
INTENSITY_RANGE = (0.1, 10_000.0)  # FLOPs per byte drawn along x


def si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


class RooflinePanel(Panel):
    PRESENTER_PLOT_PX = 140  # its legend sits above the data, inside the plot: more height on a projector

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._roofs: dict | None = None  # {"peak_flops": {dtype: FLOP/s}, "bandwidth": B/s, "how", "machine"}
        self._dots = {kind: deque(maxlen=MAX_DOTS) for kind in KIND_COLORS}
        self._verdicts: dict[str, str] = {}
        self._status = "Measuring this machine's roofs…"  # shown until the roofs arrive
        self._plot = pg.PlotWidget()
        p = self._plot.getPlotItem()
        p.setLogMode(x=True, y=True)
        p.setLabel("bottom", "arithmetic intensity (FLOPs / byte, counted)")
        p.setLabel("left", "achieved FLOP/s")
        p.showGrid(x=True, y=True, alpha=0.25)
        p.hideButtons()
        p.addLegend(offset=(-10, -10))  # bottom right: the peak's label sits top right
        p.getAxis("left").enableAutoSIPrefix(False)
        self._roof = p.plot([], [], pen=pg.mkPen(ROOF_COLOR, width=2), name="roof: bf16 peak, read bandwidth")
        self._roof_fp32 = p.plot([], [], pen=pg.mkPen(ROOF_COLOR, width=1, style=Qt.PenStyle.DashLine),
                                 name="fp32 peak")
        self._scatters = {kind: pg.ScatterPlotItem(size=7, pen=None, brush=pg.mkBrush(color))
                          for kind, color in KIND_COLORS.items()}
        for kind, scatter in self._scatters.items():
            p.addItem(scatter)
            p.legend.addItem(scatter, f"{kind} steps")
        # the peak's label under its roof at the right end (above it, the top of the view cut it off)
        self._roof_labels = (pg.TextItem(anchor=(1, 0)), pg.TextItem(anchor=(0, 0), angle=0))
        for label in self._roof_labels:
            p.addItem(label)
        self._verdict_label = QLabel()
        self._verdict_label.setTextFormat(Qt.TextFormat.RichText)
        self._verdict_label.setWordWrap(True)  # a long verdict wraps: one line made the dock 448 px wide at least
        self._how = QLabel()
        self._how.setWordWrap(True)
        self._empty = Overlay(self._plot)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._plot, 1)
        layout.addWidget(self._verdict_label)
        layout.addWidget(self._how)
        self._on_palette_changed()
        self.reset()

    # --- setters ------------------------------------------------------------------------------
    def set_roofs(self, peak_flops: dict[str, float], bandwidth: float, how: str, machine: str = "") -> None:
        """The measured roofs: FLOP/s per dtype name ("bfloat16", "float32"), read bytes/s, how measured."""
        self._roofs = {"peak_flops": dict(peak_flops), "bandwidth": float(bandwidth), "how": how,
                       "machine": machine}
        self._mark_dirty()

    def set_status(self, text: str) -> None:
        """What the roof probe is doing (shown on the plot until the roofs arrive)."""
        self._status = text
        self._mark_dirty()

    def set_presenter_scale(self, scale: float) -> None:
        """On a projector: a taller plot (its legend sits above the data, inside it), and how the roofs
        were measured moves into the plot's tooltip (three lines the room does not read)."""
        super().set_presenter_scale(scale)
        self._how.setVisible(scale <= 1)

    def add_step(self, kind: str, intensity: float, achieved_flops: float) -> None:
        """One step's dot (kind: "prefill", "decode" or "verify")."""
        if intensity > 0 and achieved_flops > 0 and kind in self._dots:
            self._dots[kind].append((intensity, achieved_flops))
            self._mark_dirty()

    def set_verdict(self, kind: str, text: str) -> None:
        self._verdicts[kind] = text
        self._mark_dirty()

    def reset(self) -> None:
        for dots in self._dots.values():
            dots.clear()
        self._verdicts.clear()
        self._mark_dirty()
        self.flush()

    def snapshot_data(self) -> dict:
        return {"roofs": self._roofs, "dots": {k: len(v) for k, v in self._dots.items()},
                "verdicts": dict(self._verdicts), "empty_text": self._empty.text()}

    # --- painting -----------------------------------------------------------------------------
    def _repaint(self) -> None:
        self._paint_roofs()
        for kind, dots in self._dots.items():
            # scatters take no log mode: they get log10 coordinates
            self._scatters[kind].setData([math.log10(d[0]) for d in dots], [math.log10(d[1]) for d in dots])
        if self._roofs is not None:  # the range: the roofs and every dot (a dock shown late kept a stale one)
            self._set_range()
        lines = [f"<span style='color:{KIND_COLORS.get(k, '#888')}'>●</span> {t}"
                 for k, t in sorted(self._verdicts.items())]
        self._verdict_label.setText("<br>".join(lines) if lines else "verdict: no steps yet")
        self._empty.set_text("" if self._roofs else self._status)

    def _set_range(self) -> None:
        lo, hi = INTENSITY_RANGE
        bw, peaks = self._roofs["bandwidth"], self._roofs["peak_flops"]
        ys = [lo * bw, max(peaks.values())] + [a for dots in self._dots.values() for _i, a in dots]
        xs = [lo, hi] + [i for dots in self._dots.values() for i, _a in dots]
        self._plot.getPlotItem().vb.setRange(xRange=(math.log10(min(xs)), math.log10(max(xs))),
                                             yRange=(math.log10(min(ys)), math.log10(max(ys))), padding=0.05)

    def _paint_roofs(self) -> None:
        if self._roofs is None:
            self._roof.setData([], [])
            self._roof_fp32.setData([], [])
            self._how.setText("")
            return
        bw, peaks = self._roofs["bandwidth"], self._roofs["peak_flops"]
        lo, hi = INTENSITY_RANGE
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        bf16 = peaks.get("bfloat16") or max(peaks.values())
        self._roof.setData(xs, [min(bf16, x * bw) for x in xs])
        set_log_ticks(self._plot.getAxis("bottom"), lo, hi)
        set_log_ticks(self._plot.getAxis("left"), lo * bw, bf16)
        fp32 = peaks.get("float32")
        self._roof_fp32.setData(xs if fp32 else [], [min(fp32, x * bw) for x in xs] if fp32 else [])
        ridge = bf16 / bw
        peak_label, bw_label = self._roof_labels
        peak_label.setText(f"bf16 peak {si(bf16, 'FLOP/s')} (measured)")
        peak_label.setPos(math.log10(hi), math.log10(bf16))
        bw_label.setText(f"read bandwidth {si(bw, 'B/s')} (measured)")
        bw_label.setPos(math.log10(max(lo, ridge / 100)), math.log10(max(lo, ridge / 100) * bw))
        fp32_text = f", fp32 {si(fp32, 'FLOP/s')}" if fp32 else ""
        self._how.setText(f"Roofs measured on {self._roofs['machine'] or 'this machine'}{fp32_text}: "
                          f"{self._roofs['how']}")
        self._plot.setToolTip(self._how.text())

    def _on_palette_changed(self) -> None:
        style_plot(self._plot, self.palette())
        fg = self.palette().color(self.palette().ColorRole.Text)
        for label in self._roof_labels:
            label.setColor(fg)
        self._mark_dirty()
