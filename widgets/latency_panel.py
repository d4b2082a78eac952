"""LatencyPanel: TTFT, time per output token and end-to-end distributions, throughput and goodput.

Goodput = finished requests per second that met both budgets (TTFT <= ttft_s and TPOT <= tpot_s),
over the last `window_s` seconds. A request with no first token (rejected, failed) misses the budget;
one with a single output token has no TPOT and is judged on TTFT alone.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from engine.events import RequestTimeline, StepStats
from widgets.fmt import ms, rate
from widgets.line_labels import place_line_labels
from widgets.panel_base import Panel
from widgets.theme import PHASE_COLORS, style_plot

PERCENTILES = (50, 95, 99)
_BINS = 30
# (key, title, scale, unit): titles short enough for a third of a projected panel; the x axis says what
# the abbreviation measures
_METRICS = (("ttft", "TTFT", 1e3, "ms"), ("tpot", "TPOT", 1e3, "ms"), ("e2e", "e2e", 1.0, "s"))
_AXIS_LABELS = {"ttft": "ms", "tpot": "ms per token", "e2e": "s per request"}
_PCT_STYLE = {50: Qt.PenStyle.SolidLine, 95: Qt.PenStyle.DashLine, 99: Qt.PenStyle.DotLine}




def latency_percentiles(values) -> dict[int, float] | None:
    """{50: p50, 95: p95, 99: p99} with numpy's linear interpolation; None for no values."""
    a = np.asarray(list(values), dtype=np.float64)
    if a.size == 0:
        return None
    return dict(zip(PERCENTILES, (float(v) for v in np.percentile(a, PERCENTILES))))


class LatencyPanel(Panel):
    PRESENTER_PLOT_PX = 115  # histograms: their labels and budget line need the height on a projector

    def __init__(self, parent: QWidget | None = None, window_s: float = 30.0, rate_window_s: float = 5.0,
                 max_requests: int = 5000) -> None:
        super().__init__(parent)
        self._window_s, self._rate_window_s = window_s, rate_window_s
        self._finished: deque[RequestTimeline] = deque(maxlen=max_requests)
        self._steps: deque[tuple[float, float, int]] = deque(maxlen=4000)  # (t_start, t_end, tokens)
        self._budget: tuple[float, float] | None = None
        self._t_first: float | None = None
        self._now = 0.0
        # an attached server's own generated tokens/s (its /metrics counter); when set, it is the
        # throughput shown, not the tokens this client saw arrive
        self._server_rate: tuple[float | None, str] | None = None

        self._summary = QLabel()
        self._summary.setTextFormat(Qt.TextFormat.RichText)
        self._summary.setWordWrap(True)
        self._plots: dict[str, pg.PlotWidget] = {}
        self._hists: dict[str, pg.PlotDataItem] = {}
        self._lines: dict[str, dict[object, pg.InfiniteLine]] = {}
        self._labels: dict[str, QLabel] = {}
        grid = QGridLayout()
        for col, (key, title, _scale, _unit) in enumerate(_METRICS):
            self._build_histogram(grid, col, key, title)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._summary)
        layout.addLayout(grid, 1)
        self._on_palette_changed()
        self.reset()

    def _build_histogram(self, grid: QGridLayout, col: int, key: str, title: str) -> None:
        w = pg.PlotWidget()
        p = w.getPlotItem()
        p.setTitle(title)
        p.setLabel("bottom", _AXIS_LABELS[key])
        p.setMouseEnabled(x=False, y=False)
        p.hideButtons()
        color = PHASE_COLORS["decode"]
        self._hists[key] = w.plot([0.0], [], stepMode="center", fillLevel=0, brush=color + "99",
                                  pen=pg.mkPen(color))
        lines: dict[object, pg.InfiniteLine] = {}
        for q in PERCENTILES:
            lines[q] = pg.InfiniteLine(angle=90, label=f"p{q}", pen=pg.mkPen("#9e9e9e", style=_PCT_STYLE[q]),
                                       labelOpts={"position": 0.92 - 0.1 * PERCENTILES.index(q)})
        if key in ("ttft", "tpot"):
            lines["budget"] = pg.InfiniteLine(angle=90, label="budget", pen=pg.mkPen("#e15759", width=2),
                                              labelOpts={"position": 0.6, "color": "#e15759"})
        for line in lines.values():
            line.hide()
            w.addItem(line)
        label = QLabel()
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        label.setWordWrap(True)  # growing numbers must not widen the dock
        self._plots[key], self._lines[key], self._labels[key] = w, lines, label
        p.vb.sigResized.connect(lambda *_: self._mark_dirty())  # its line labels are placed for its size
        grid.addWidget(w, 0, col)
        grid.addWidget(label, 1, col)

    # --- setters ------------------------------------------------------------------------------
    def add_finished(self, timeline: RequestTimeline) -> None:
        self._finished.append(timeline)
        self._seen(timeline.arrival, timeline.finished if timeline.finished is not None else timeline.arrival)
        self._mark_dirty()

    def add_step(self, stats: StepStats) -> None:
        self.add_tokens(stats.t_start, stats.t_start + stats.wall_time_s, stats.num_tokens)

    def add_tokens(self, t_start: float, t_end: float, num_tokens: int) -> None:
        """Tokens produced between two moments: an engine step, or a chunk of an attached server's
        stream as it arrived (the total tokens/s counts them)."""
        self._steps.append((t_start, t_end, num_tokens))
        self._seen(t_start, t_end)
        self._mark_dirty()

    def set_server_tokens_per_s(self, tokens_per_s: float | None, server: str) -> None:
        """The server's generated tokens/s from its /metrics (None until two scrapes give a rate)."""
        self._server_rate = (tokens_per_s, server)
        self._mark_dirty()

    def set_budget(self, ttft_s: float, tpot_s: float) -> None:
        self._budget = (ttft_s, tpot_s)
        self._mark_dirty()

    def reset(self) -> None:
        self._finished.clear()
        self._steps.clear()
        self._t_first, self._now = None, 0.0
        self._server_rate = None
        self._mark_dirty()
        self.flush()

    def _seen(self, t0: float, t1: float) -> None:
        self._t_first = t0 if self._t_first is None else min(self._t_first, t0)
        self._now = max(self._now, t1)

    # --- derived numbers ----------------------------------------------------------------------
    def values(self, key: str) -> list[float]:
        """Seconds: 'ttft', 'tpot' or 'e2e' of every finished request that has one."""
        return [v for v in (getattr(t, key) for t in self._finished) if v is not None]

    def total_tokens_per_s(self) -> float | None:
        """The attached server's generated tokens/s when it reports one; else: tokens of the steps that
        started in the last rate_window_s seconds, over the time they span (the last step alone when it
        is longer than the window)."""
        if self._server_rate is not None:
            return self._server_rate[0]
        recent = [s for s in self._steps if s[0] >= self._now - self._rate_window_s] or list(self._steps)[-1:]
        if not recent:
            return None
        span = self._now - min(s[0] for s in recent)
        return sum(s[2] for s in recent) / span if span > 0 else None

    def meets_budget(self, t: RequestTimeline) -> bool:
        if self._budget is None:
            return True
        ttft, tpot = t.ttft, t.tpot
        return ttft is not None and ttft <= self._budget[0] and (tpot is None or tpot <= self._budget[1])

    def goodput(self) -> tuple[float | None, int, int]:
        """(requests/s meeting the budget, how many met it, how many finished) over the window."""
        recent = [t for t in self._finished if t.finished is not None and t.finished >= self._now - self._window_s]
        ok = sum(1 for t in recent if self.meets_budget(t))
        span = min(self._window_s, self._now - (self._t_first if self._t_first is not None else self._now))
        return (ok / span if span > 0 and recent else None), ok, len(recent)

    def snapshot_data(self) -> dict:
        gp, ok, n = self.goodput()
        return {
            "num_finished": len(self._finished),
            "percentiles": {key: latency_percentiles(self.values(key)) for key, *_ in _METRICS},
            "total_tokens_per_s": self.total_tokens_per_s(),
            "tokens_per_s_from": "client" if self._server_rate is None else "server",
            "goodput_rps": gp, "num_within_budget": ok, "num_in_window": n, "budget": self._budget,
            "summary": self._summary.text(),
        }

    # --- painting -----------------------------------------------------------------------------
    def _repaint(self) -> None:
        for key, _title, scale, unit in _METRICS:
            self._repaint_histogram(key, scale, unit)
        gp, ok, n = self.goodput()
        if self._server_rate is not None:
            text = f"generated <b>{rate(self.total_tokens_per_s(), 'tok/s')}</b> ({self._server_rate[1]}'s /metrics)"
        else:
            text = f"total <b>{rate(self.total_tokens_per_s(), 'tok/s')}</b> (last {self._rate_window_s:.0f} s)"
        if self._budget is None:
            text += " · goodput: <i>no latency budget set</i>"
        else:
            share = f" ({100 * ok / n:.0f}% of {n})" if n else ""
            text += (f" · goodput <b>{rate(gp, 'req/s')}</b>{share} within TTFT ≤ {ms(self._budget[0])}"
                     f" and TPOT ≤ {ms(self._budget[1])} (last {self._window_s:.0f} s)")
        self._summary.setText(text)

    def _repaint_histogram(self, key: str, scale: float, unit: str) -> None:
        vals = np.asarray(self.values(key), dtype=np.float64) * scale
        pct = latency_percentiles(vals)
        lines = self._lines[key]
        budget = None
        if self._budget is not None and key in ("ttft", "tpot"):
            budget = self._budget[0 if key == "ttft" else 1] * scale
        if "budget" in lines:
            lines["budget"].setVisible(budget is not None)
            if budget is not None:
                lines["budget"].setValue(budget)
        if pct is None:
            self._hists[key].setData([0.0], [])
            for q in PERCENTILES:
                lines[q].hide()
            self._labels[key].setText("no finished requests yet")
            self._plots[key].setYRange(0, 1, padding=0)
            self._plots[key].setXRange(0, (budget or 1.0) * 1.3, padding=0)
            return
        hi = max(pct[99] * 1.3, (budget or 0.0) * 1.15, 1e-9)
        counts, edges = np.histogram(np.minimum(vals, hi), bins=_BINS, range=(0.0, hi))
        self._hists[key].setData(edges, counts)
        self._plots[key].setYRange(0, max(1, counts.max()) * 1.1, padding=0)
        self._plots[key].setXRange(0, hi, padding=0.02)
        for q in PERCENTILES:
            lines[q].setValue(pct[q])
            lines[q].show()
        marks = [(budget, lines["budget"].label, "budget")] if budget is not None else []
        place_line_labels(self._plots[key].getPlotItem().vb,
                          marks + [(pct[q], lines[q].label, f"p{q}") for q in PERCENTILES])
        fmt = (lambda v: f"{v:.0f}") if unit == "ms" else (lambda v: f"{v:.2f}")
        self._labels[key].setText(" · ".join(f"p{q} {fmt(pct[q])} {unit}" for q in PERCENTILES)
                                  + f"  (n={vals.size})")

    def _on_palette_changed(self) -> None:
        fg = self.palette().color(self.palette().ColorRole.Text)
        for key, plot in self._plots.items():
            style_plot(plot, self.palette())
            for q in PERCENTILES:
                self._lines[key][q].label.setColor(fg)
