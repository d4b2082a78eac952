"""TradeoffPanel: speed per user against cost, coloured by measured quality, with the Pareto frontier.

x: tokens/s per user (log), y: $ per million tokens at the editable GPU-hour price (log), colour:
top-1 agreement with the 16-bit model (measured; grey when not measured). Measured points are filled;
predicted points (a cost model's, for other models and devices) are hollow and say "predicted".
Hovering shows a point's configuration; clicking a measured point emits sigApply(config), right-clicking
it sigCopyCommand(config) (the app turns it into an `inferlab serve` line). Frontier points and one point
per predicted group get a full label, every other measured point a short one (batch, weight format, drafts), placed
so that no two overlap (where none fits, hover names it). A point measured several times shows the least
and the most of its runs as bars.
"""
from __future__ import annotations

import csv
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.events import TradeoffPoint
from widgets.command_bar import CommandBar
from widgets.log_axis import set_log_ticks
from widgets.overlay import Overlay
from widgets.panel_base import Panel
from widgets.theme import style_plot
from widgets.tradeoff_labels import place_labels
from widgets.tradeoff_points import (  # noqa: F401 (cost_per_million_tokens, PREDICTED: this module's API too)
    _NONE,
    AGREEMENT_BAD,
    NOT_MEASURED,
    PREDICTED,
    cost_per_million_tokens,
    free_spot,
    gap_text,
    point_batch,
    predicted_label,
    quality_color,
    server_label,
    short_label,
    spread_bars,
    sweep_config,
    sweep_label,
)

DEFAULT_PRICE_PER_HOUR = 2.50


class TradeoffPanel(Panel):
    PRESENTER_PLOT_PX = 130  # the chapter's chart: readable on a projector, the comparison takes the rest

    sigSweep = Signal()
    sigPriceChanged = Signal(float)  # $ per GPU-hour
    sigApply = Signal(dict)  # a measured point's engine configuration, to apply to the live engine
    sigExport = Signal()
    sigCopyCommand = Signal(dict)  # a measured point's engine configuration, as a `inferlab serve` line
    sigCopyText = Signal(str)  # a managed server's point: its command line, as it ran
    sigRunPoint = Signal(str)  # a managed server's point (its label): run it in a window of its own
    sigSweepLoad = Signal(int)  # "Run the sweep's load": this many requests always in flight, live

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._points: dict[str, dict] = {}  # measured: label -> plain dict
        self._predicted: dict[str, dict] = {}
        self._frontier: list[str] = []
        self._current: str | None = None
        self._applied: str | None = None  # the sweep point last applied: the ring stays on it
        self._live: str | None = None  # the live configuration's point meanwhile
        self._labels: dict[str, pg.TextItem] = {}
        self._price = QDoubleSpinBox()
        self._price.setRange(0.0, 1000.0)
        self._price.setDecimals(2)
        self._price.setSingleStep(0.1)
        self._price.setPrefix("$ ")
        self._price.setSuffix(" / GPU-hour")
        self._price.setValue(DEFAULT_PRICE_PER_HOUR)
        self._price.valueChanged.connect(self._on_price_changed)
        self._sweep = QPushButton("Run sweep (S)")
        self._sweep.setToolTip("batch 1/8/32 x bf16/int8/fp8/int4 weights x draft 0/4 on separate engines (a few "
                               "minutes); "
                               "the live requests finish first (new load pauses, nothing is aborted) and the "
                               "live panels are not touched")
        self._sweep.clicked.connect(self.sigSweep)
        self._export = QPushButton("Export…")
        self._export.clicked.connect(self.sigExport)
        self._show_predicted = QCheckBox("7B/70B predicted")
        self._show_predicted.setChecked(True)
        self._show_predicted.setToolTip("the cost model's hollow squares for larger models on A100/H100/H200: "
                                        "off, the plot's axes fit the measured points alone")
        self._show_predicted.toggled.connect(lambda _on: self._mark_dirty())
        self._gap = QLabel()  # why the live point sits off the applied sweep point
        self._gap.setWordWrap(True)
        self._gap.hide()
        self._sweep_load = QPushButton("Run the sweep's load")
        self._sweep_load.setToolTip("the live load as the sweep measured: the point's batch of requests always in "
                                    "flight, no waiting (the arrival-rate slider takes it back)")
        self._sweep_load.clicked.connect(self._on_sweep_load)
        self._sweep_load.hide()
        self._legend = QLabel()
        self._legend.setWordWrap(True)
        self._legend.setTextFormat(Qt.TextFormat.RichText)
        self._plot = pg.PlotWidget()
        p = self._plot.getPlotItem()
        p.setLogMode(x=True, y=True)
        p.setLabel("bottom", "tokens/s per user")
        p.setLabel("left", "$ per 1M tokens")
        p.showGrid(x=True, y=True, alpha=0.25)
        p.hideButtons()
        self._frontier_curve = p.plot([], [], pen=pg.mkPen("#fdd663", width=2, style=Qt.PenStyle.DashLine))
        self._scatter = pg.ScatterPlotItem(size=13, hoverable=True, tip=self._tip)
        self._scatter.sigClicked.connect(self._on_clicked)
        self._ring = pg.ScatterPlotItem(size=26, symbol="o", brush=None, pen=pg.mkPen("#fdd663", width=3))
        self._spread = pg.ErrorBarItem(x=np.zeros(0), y=np.zeros(0), pen=pg.mkPen("#9aa0a6", width=1.5), beam=0.0)
        p.addItem(self._spread)  # a point measured several times: the least and the most of its runs
        p.addItem(self._scatter)
        p.addItem(self._ring)
        self._empty = Overlay(self._plot)
        self._command = CommandBar()  # the chosen server point's command line
        self._command.sigCopy.connect(self.sigCopyText)
        self._command.sigRun.connect(lambda: self._current and self.sigRunPoint.emit(self._current))
        row = QHBoxLayout()
        row.addWidget(QLabel("price"))
        row.addWidget(self._price)
        row.addStretch(1)
        row.addWidget(self._export)
        row.addWidget(self._sweep)
        gap = QHBoxLayout()
        gap.addWidget(self._gap, 1)
        gap.addWidget(self._sweep_load, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(row)
        layout.addWidget(self._plot, 1)
        layout.addLayout(gap)
        layout.addWidget(self._command)
        legend = QHBoxLayout()
        legend.addWidget(self._legend, 1)
        legend.addWidget(self._show_predicted, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(legend)
        self._on_palette_changed()
        self.reset()

    # --- setters ------------------------------------------------------------------------------
    def add_point(self, point: TradeoffPoint) -> None:
        """A live configuration's measured point (the same label replaces the earlier measurement)."""
        self._points[point.label] = {
            "label": point.label, "config": dict(point.config), "tokens_per_s_user": point.tokens_per_s_per_user,
            "tokens_per_s_total": point.total_tokens_per_s, "ppl_delta_pct": point.perplexity_delta_pct,
            "kl": None, "agreement": None, "source": "live"}
        self._mark_dirty()

    def add_sweep_point(self, p: dict) -> None:
        """One measured sweep point (app/tradeoff/sweep.py's dict) as it arrives."""
        label = sweep_label(p)
        self._points[label] = {**p, "label": label, "source": "sweep",
                               "config": sweep_config(p)}
        self._mark_dirty()

    def set_sweep(self, result: dict) -> None:
        """A whole sweep result: its measured points, frontier and predicted points (kept apart)."""
        self._points = {k: v for k, v in self._points.items() if v["source"] != "sweep"}
        for p in result.get("points", []):
            if not p.get("predicted"):
                self.add_sweep_point(p)
        self._frontier = [sweep_label(f) for f in result.get("frontier", [])]
        self._predicted = {predicted_label(p): {**p, "label": predicted_label(p)}
                           for p in result.get("predicted", []) if p.get("predicted") and p.get("tokens_per_s_total")}
        self._mark_dirty()

    def add_server_point(self, p: dict) -> None:
        """One measured point of a managed server's tuning sweep (app/tradeoff/tune.py's dict:
        engine, model, label, flags, command and the explorer's figures) as it arrives."""
        label = server_label(p["engine"], p["model"], p["label"])
        self._points[label] = {**p, "label": label, "source": "server", "config": None}
        self._mark_dirty()

    def set_server_sweep(self, engine: str, model: str, points: list[dict], frontier: list[str]) -> None:
        """A whole tuning sweep of `engine` serving `model`: its measured points replace that engine and
        model's earlier ones; its frontier (the points' labels) is the one drawn."""
        self._points = {k: v for k, v in self._points.items()
                        if not (v["source"] == "server" and v["engine"] == engine and v["model"] == model)}
        for p in points:
            self.add_server_point(p)
        self._frontier = [server_label(engine, model, label) for label in frontier]
        self._mark_dirty()

    def select_point(self, label: str | None) -> None:
        """Ring a point; a server point's command line shows under the plot, with "Copy command"."""
        p = self._points.get(label or "")
        self._current = label if p is not None else None
        command = p.get("command") if p is not None else None
        self._command.set_command(f"{label} · flags: {p.get('flags', '')}" if command else "", command or "")
        self._mark_dirty()

    def sweep_points(self) -> list[dict]:
        """The measured sweep points shown (app/tradeoff/sweep.py's dicts, with label and config)."""
        return [dict(p) for p in self._points.values() if p["source"] == "sweep"]

    def set_current(self, label: str | None) -> None:
        """The live configuration's point; while a sweep point applied is pinned, the ring stays on it and
        the live point is compared with it under the plot."""
        if self._applied is not None:
            self._live = label
        else:
            self._current = label
        self._mark_dirty()

    def set_applied(self, label: str | None) -> None:
        """Pin the ring on an applied sweep point (None: the sliders moved; the ring follows the live point)."""
        self._applied = label if label in self._points else None
        if self._applied is not None:
            self._current = self._applied
        elif self._live is not None:
            self._current = self._live
        self._live = None if self._applied is None else self._live
        self._mark_dirty()

    def _on_sweep_load(self) -> None:
        p = self._points.get(self._applied or "")
        batch = point_batch(p) if p is not None else None
        if batch is not None:
            self.sigSweepLoad.emit(batch)

    def set_price_per_hour(self, price: float) -> None:
        self._price.setValue(price)

    def price_per_hour(self) -> float:
        return self._price.value()

    def clear(self) -> None:
        self._points.clear()
        self._predicted.clear()
        self._frontier = []
        self._current = self._applied = self._live = None
        self._command.set_command("", "")
        self._mark_dirty()
        self.flush()

    def reset(self) -> None:
        self.clear()

    def export_png(self, path: str) -> bool:
        return self.grab().save(path)

    def export_csv(self, path: str) -> None:
        rows = self.snapshot_data()["points"] + self.snapshot_data()["predicted"]
        fields = ("label", "tokens_per_s_per_user", "total_tokens_per_s", "cost_per_million_tokens",
                  "perplexity_delta_pct", "kl", "agreement", "predicted", "on_frontier")
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    def snapshot_data(self) -> dict:
        price = self.price_per_hour()

        def row(p: dict, predicted: bool) -> dict:
            return {"label": p["label"], "tokens_per_s_per_user": p["tokens_per_s_user"],
                    "total_tokens_per_s": p["tokens_per_s_total"],
                    "cost_per_million_tokens": cost_per_million_tokens(price, p["tokens_per_s_total"]),
                    "perplexity_delta_pct": p.get("ppl_delta_pct"), "kl": p.get("kl"), "agreement": p.get("agreement"),
                    "predicted": predicted, "hollow": predicted, "on_frontier": p["label"] in self._frontier,
                    "source": p.get("source", "predicted")}
        points = [row(p, False) for p in self._points.values()]
        return {"price_per_hour": price, "points": points, "num_points": len(points),
                "predicted": [row(p, True) for p in self._predicted.values()], "frontier": list(self._frontier),
                "labels": sorted(label for label, item in self._labels.items() if item.isVisible()),
                "current": self._current, "empty_text": self._empty.text(),
                "command": {"title": self._command.title(), "line": self._command.command(),
                            "shown": self._command.isVisibleTo(self)}}

    # --- painting -----------------------------------------------------------------------------
    def _positions(self) -> dict[str, tuple[float, float]]:
        price, out = self.price_per_hour(), {}
        predicted = list(self._predicted.items()) if self._show_predicted.isChecked() else []
        for label, p in list(self._points.items()) + predicted:
            cost = cost_per_million_tokens(price, p["tokens_per_s_total"])
            # log axes: only positive finite coordinates (a throughput near the float limit costs 0 $)
            if cost and math.isfinite(cost) and p["tokens_per_s_user"] and 0 < p["tokens_per_s_user"] < math.inf:
                out[label] = (p["tokens_per_s_user"], cost)
        return out

    def _repaint(self) -> None:
        pos = self._positions()
        spots = []
        for label, (x, y) in pos.items():
            predicted = label in self._predicted
            p = self._predicted[label] if predicted else self._points[label]
            color = quality_color(p.get("agreement"))
            # scatters take no log mode: they get log10 coordinates
            spots.append({"pos": (math.log10(x), math.log10(y)), "data": label, "symbol": "s" if predicted else "o",
                          "brush": None if predicted else pg.mkBrush(color),
                          "pen": pg.mkPen(_NONE if predicted else color.darker(130), width=2)})
        self._scatter.setData(spots)
        bars = spread_bars(self._points, pos, self.price_per_hour())
        self._spread.setData(**{k: np.asarray(v, dtype=float) for k, v in bars.items()})
        if pos:
            xs, ys = [x for x, _ in pos.values()], [y for _, y in pos.values()]
            set_log_ticks(self._plot.getAxis("bottom"), min(xs), max(xs))
            set_log_ticks(self._plot.getAxis("left"), min(ys), max(ys))
        front = sorted((pos[label] for label in self._frontier if label in pos), key=lambda xy: xy[0])
        self._frontier_curve.setData([x for x, _ in front], [y for _, y in front])
        place_labels(self, pos, bars)
        cur = pos.get(self._current or "")
        self._ring.setData([math.log10(cur[0])] if cur else [], [math.log10(cur[1])] if cur else [])
        self._plot.getPlotItem().setLabel("left", f"$/1M tokens at ${self.price_per_hour():.2f}/h")
        self._empty.set_text("" if pos else "No measured points yet — press “Run sweep” (S).")
        self._update_legend()
        self._update_gap()

    def _update_gap(self) -> None:
        swept, live = self._points.get(self._applied or ""), self._points.get(self._live or "")
        shown = swept is not None and live is not None and bool(live.get("tokens_per_s_total"))
        self._gap.setText(gap_text(live, swept) if shown else "")
        self._gap.setVisible(shown)
        self._sweep_load.setVisible(shown and point_batch(swept) is not None)

    def _tip(self, x: float | None = None, y: float | None = None, data: object = None) -> str:
        """The hovered spot's text; pyqtgraph 0.14 calls tip(x=, y=, data=) by keyword (x, y unused:
        the point's own figures are shown, not the log10 coordinates it is drawn at)."""
        label = str(data)
        p = self._predicted.get(label) or self._points.get(label)
        if p is None:
            return ""
        cost = cost_per_million_tokens(self.price_per_hour(), p["tokens_per_s_total"]) or 0.0
        if label in self._predicted:
            return (f"{label}\n{p['tokens_per_s_user']:.0f} tok/s per user · {p['tokens_per_s_total']:.0f} tok/s "
                    f"total\n${cost:.4f} per 1M tokens\nweights {p['weights_bytes'] / 1e9:.1f} GB · KV "
                    f"{p['kv_capacity_tokens']:,} tokens\ncost model calibrated on this machine: not measured")
        kind = "greedy agreement" if p.get("command") else "top-1 agreement"  # a server's: its own generated tokens
        parts = [f"{kind} {100 * p['agreement']:.1f} %" if p.get("agreement") is not None else None,
                 f"KL {p['kl']:.4f}" if p.get("kl") is not None else None,  # a server's point: none without
                 f"perplexity {p['ppl_delta_pct']:+.2f} %" if p.get("ppl_delta_pct") is not None else None]  # logprobs
        quality = " · ".join(q for q in parts if q) or NOT_MEASURED
        lat = ""
        if p.get("p50_tpot_ms") is not None:
            lat = f"\nTPOT p50 {p['p50_tpot_ms']:.0f} ms · p99 {p['p99_tpot_ms']:.0f} ms"
        if p.get("p50_ttft_ms") is not None:
            lat += f" · TTFT p50 {p['p50_ttft_ms']:.0f} ms"
        if p.get("flags"):  # a managed server's point: the flags it ran with
            lat += f"\nflags: {p['flags']}"
        action = ("click: show its command line" if p.get("command") else
                  "click: apply to the live engine · right-click: copy as an `inferlab serve` command")
        return (f"{label}\n{p['tokens_per_s_user']:.1f} tok/s per user · {p['tokens_per_s_total']:.0f} tok/s total\n"
                f"${cost:.3f} per 1M tokens\n{quality}{lat}\n{action}")

    def _on_clicked(self, _item, spots, ev=None) -> None:
        """Left click: apply the point to the live engine; right click: copy it as a serve command."""
        copy = ev is not None and ev.button() == Qt.MouseButton.RightButton
        for spot in spots:
            p = self._points.get(str(spot.data()))
            if p is not None and p.get("command"):  # a managed server's point: choose it
                self.select_point(p["label"])
                return
            if p is not None and p.get("config"):
                if not copy and p["source"] == "sweep":
                    self.set_applied(p["label"])  # the ring moves to it and stays (set_current: the live point)
                (self.sigCopyCommand if copy else self.sigApply).emit(dict(p["config"]))
                return

    def _update_legend(self) -> None:
        chips = " ".join(f"<span style='color:{quality_color(a).name()}'>●</span> {100 * a:.0f}%"
                         for a in (1.0, (1 + AGREEMENT_BAD) / 2, AGREEMENT_BAD))
        current = f" · <span style='color:#fdd663'>◯</span> current: <b>{self._current}</b>" if self._current else ""
        servers = any(p.get("command") for p in self._points.values())  # a managed server's sweep
        kind = "greedy agreement with the bf16 point" if servers else "top-1 agreement with 16-bit"
        self._legend.setText(
            f"colour = {kind} (measured): {chips} · "
            f"<span style='color:{_NONE.name()}'>●</span> {NOT_MEASURED} · ▢ hollow = {PREDICTED} "
            f"(not measured) · dashed = frontier{current}")

    def _on_price_changed(self, value: float) -> None:
        self.sigPriceChanged.emit(value)
        self._mark_dirty()

    def _on_palette_changed(self) -> None:
        style_plot(self._plot, self.palette())
        self._mark_dirty()
