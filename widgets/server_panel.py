"""ServerPanel: an attached server as its /metrics and its streams show it.

Top: the connection (connected, slow, down, garbage) and the server's gauges and counter rates, each
fact the server does not export named as such. Middle: latency percentiles, the server's estimated
from its histogram buckets (labelled "bucket estimate") beside the client's measured on arrival.
Bottom: running / waiting requests and generated tokens/s over the last two minutes.
Fed plain dicts by the app (app/gui/panel_feeder.py); computes nothing but the plot arrays.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from widgets.fmt import ms, rate
from widgets.panel_base import Panel
from widgets.theme import phase_color, style_plot

HISTORY_S = 120.0
_STATE_COLORS = {"connected": "#59a14f", "slow": "#f28e2b", "down": "#e15759", "garbage": "#e15759",
                 "no-metrics": "#f28e2b", "connecting": "#9e9e9e", "restarting": "#9e9e9e"}
_LATENCY_ROWS = (("ttft", "TTFT"), ("itl", "inter-token"), ("e2e", "end-to-end"))


def _pct(v: float | None) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{100 * v:.0f}%"


class ServerPanel(Panel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._status: tuple[str, str] = ("connecting", "")
        self._facts: dict | None = None
        self._client: dict[str, list[float]] = {"ttft": [], "itl": [], "e2e": []}
        self._series: deque[tuple[float, float, float, float]] = deque()  # (t, running, waiting, gen tok/s)
        self._status_label = QLabel()
        self._status_label.setWordWrap(True)
        self._status_label.setTextFormat(Qt.TextFormat.RichText)
        self._facts_label = QLabel()
        self._facts_label.setWordWrap(True)
        self._facts_label.setTextFormat(Qt.TextFormat.RichText)
        self._latency_label = QLabel()
        self._latency_label.setTextFormat(Qt.TextFormat.RichText)
        self._latency_label.setWordWrap(True)
        self._queue_plot = pg.PlotWidget()
        self._rate_plot = pg.PlotWidget()
        for w, title in ((self._queue_plot, "requests (server)"), (self._rate_plot, "generated tokens/s (server)")):
            w.setMinimumHeight(90)
            p = w.getPlotItem()
            p.setTitle(title)
            p.setMouseEnabled(x=False, y=False)
            p.hideButtons()
            p.showGrid(x=False, y=True, alpha=0.25)
            p.setLabel("bottom", "seconds ago")
        self._queue_plot.getPlotItem().addLegend(offset=(-5, 5), colCount=2, brush=pg.mkBrush(128, 128, 128, 60))
        qp = self._queue_plot.getPlotItem()
        self._running = qp.plot([], [], pen=pg.mkPen(phase_color("running"), width=2), name="running")
        self._waiting = qp.plot([], [], pen=pg.mkPen(phase_color("waiting"), width=2), name="waiting")
        self._gen = self._rate_plot.getPlotItem().plot([], [], pen=pg.mkPen(phase_color("decode"), width=2))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.addWidget(self._status_label)
        layout.addWidget(self._facts_label)
        layout.addWidget(self._latency_label)
        layout.addWidget(self._queue_plot, 1)
        layout.addWidget(self._rate_plot, 1)
        self._on_palette_changed()
        self.reset()

    # --- setters ------------------------------------------------------------------------------
    def set_status(self, state: str, text: str) -> None:
        self._status = (state, text)
        self._mark_dirty()

    def set_facts(self, facts: dict) -> None:
        """One scrape: ServerFacts as a dict (app/remote/facts.py)."""
        self._facts = facts
        gen = facts.get("generation_tokens_per_s")
        self._series.append((facts["t"], facts.get("running") or 0.0, facts.get("waiting") or 0.0,
                             gen if gen is not None else math.nan))
        while self._series and facts["t"] - self._series[0][0] > HISTORY_S:
            self._series.popleft()
        self._mark_dirty()

    def add_client_timings(self, ttft_s: float | None, e2e_s: float | None, inter_token_s) -> None:
        """A finished stream's timings as the client measured them on arrival."""
        if ttft_s is not None:
            self._client["ttft"].append(ttft_s)
        if e2e_s is not None:
            self._client["e2e"].append(e2e_s)
        self._client["itl"].extend(inter_token_s)
        for values in self._client.values():
            del values[:-20000]
        self._mark_dirty()

    def reset(self) -> None:
        self._facts = None
        self._series.clear()
        for values in self._client.values():
            values.clear()
        self._mark_dirty()
        self.flush()

    def snapshot_data(self) -> dict:
        return {"status": self._status, "facts": self._facts, "num_samples": len(self._series),
                "client_counts": {k: len(v) for k, v in self._client.items()},
                "facts_text": self._facts_label.text(), "latency_text": self._latency_label.text()}

    # --- painting -----------------------------------------------------------------------------
    def _repaint(self) -> None:
        state, text = self._status
        color = _STATE_COLORS.get(state, "#9e9e9e")
        self._status_label.setText(f"<span style='color:{color}'>●</span> <b>{state}</b> — {text}")
        self._facts_label.setText(self._facts_html())
        self._latency_label.setText(self._latency_html())
        if not self._series:
            for curve in (self._running, self._waiting, self._gen):
                curve.setData([], [])
            return
        a = np.array(self._series, dtype=np.float64)
        ago = a[:, 0] - a[-1, 0]
        self._running.setData(ago, a[:, 1])
        self._waiting.setData(ago, a[:, 2])
        ok = np.isfinite(a[:, 3])
        self._gen.setData(ago[ok], a[ok, 3])
        for w in (self._queue_plot, self._rate_plot):
            w.setXRange(-HISTORY_S if len(ago) > 1 and ago[0] < -HISTORY_S / 2 else min(-10.0, ago[0]), 0, padding=0)
        self._queue_plot.setYRange(0, max(1.0, a[:, 1].max(), a[:, 2].max()) * 1.3, padding=0)
        self._rate_plot.setYRange(0, max(1.0, np.nanmax(a[:, 3]) if ok.any() else 1.0) * 1.2, padding=0)

    def _facts_html(self) -> str:
        f = self._facts
        if f is None:
            return "<i>no /metrics scraped yet</i>"
        word = f.get("preemption_word", "preemptions")
        rows = [("running / waiting", f"{_num(f.get('running'))} / {_num(f.get('waiting'))}"),
                ("KV cache in use", _pct(f.get("kv_usage"))),
                ("prefix-cache hits", _pct(f.get("prefix_hit_rate"))),
                ("prompt · generated", f"{rate(f.get('prompt_tokens_per_s'), 'tok/s')} · "
                                       f"{rate(f.get('generation_tokens_per_s'), 'tok/s')}"),
                (word, f"{_num(f.get('preemptions_total'))} ({rate(f.get('preemptions_per_s'), '/s')})"),
                ("speculative acceptance", _pct(f.get("spec_acceptance")))]
        blocks = f.get("kv_blocks")
        if blocks:
            rows.append(("KV blocks", f"{blocks[0]:,} × {blocks[1]} tokens"))
        elif f.get("kv_capacity_tokens") is not None:
            rows.append(("KV pool", f"{f['kv_capacity_tokens']:,.0f} tokens"))
        html = " · ".join(f"{k} <b>{v}</b>" for k, v in rows)
        missing = f.get("not_exposed") or ()
        if missing:
            html += f"<br><i>not exposed by {f.get('server_name', 'this server')}: {', '.join(missing)}</i>"
        return html

    def _latency_html(self) -> str:
        lat = (self._facts or {}).get("latency") or {}
        cells = ["<tr><th></th><th>server p50 · p95 · p99<br><small>bucket estimate</small></th>"
                 "<th>client p50 · p99<br><small>measured</small></th></tr>"]
        for key, title in _LATENCY_ROWS:
            b = lat.get(key)
            if b is None:
                server = "not exposed" if self._facts is not None and key in _missing_keys(self._facts) else "—"
            else:
                vals = b["values"]
                server = " · ".join(("&gt;" if q in b["capped"] else "") + ms(vals.get(q)) for q in (50, 95, 99))
                span = f"{b['window_s']:.0f} s" if b.get("window_s") else "all"
                server += f" <small>n={b['count']}, {span}</small>"
            client = self._client[key]
            if client:
                p50, p99 = np.percentile(np.asarray(client), (50, 99))
                mine = f"{ms(float(p50))} · {ms(float(p99))} <small>n={len(client)}</small>"
            else:
                mine = "—"
            cells.append(f"<tr><td>{title}</td><td>{server}</td><td>{mine}</td></tr>")
        return "<table cellspacing='6'>" + "".join(cells) + "</table>"

    def _on_palette_changed(self) -> None:
        for w in (self._queue_plot, self._rate_plot):
            style_plot(w, self.palette())


def _num(v) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.0f}"


def _missing_keys(facts: dict) -> set[str]:
    names = {"TTFT histogram": "ttft", "inter-token histogram": "itl", "end-to-end histogram": "e2e"}
    return {names[n] for n in facts.get("not_exposed") or () if n in names}
