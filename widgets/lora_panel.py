"""LoraPanel: multi-LoRA serving as it happens: the adapter pool (device slots, host memory, hits, loads,
evictions), the batch's rows per step by adapter, and one prompt answered by every adapter at once.

Fed from the engine's step events (`StepStats.scheduled_loras`, `EngineStepEvent.lora_events` and
`lora_pool`) and from the adapters the source registered (`set_adapters`). Every colour is the adapter's
(widgets.theme.adapter_color), the same in the token stream and the Gantt chart.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPalette
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from engine.events import LoraPoolEvent, LoraPoolSnapshot, StepStats
from widgets.fmt import human_bytes
from widgets.panel_base import Panel
from widgets.theme import adapter_color, style_plot

OFF_TEXT = "Multi-LoRA: off (this engine has no adapter pool; open the multi-lora preset)"
BASE = "base"
MAX_EVENTS_SHOWN = 3
DEFAULT_QUESTION = "Give me three tips for a good night's sleep."


def _label(name: str | None) -> str:
    return name or BASE


def chip(name: str | None, text: str | None = None) -> str:
    """Rich text: the adapter's name (or `text`) on its colour."""
    return (f"<span style='background:{adapter_color(name).name()}; color:#111'>&nbsp;{text or _label(name)}"
            "&nbsp;</span>")


@dataclass(frozen=True, slots=True)
class AdapterRow:
    """What the panel shows of one registered adapter (plain data; app/source/channel.py LoraAdapters)."""

    name: str
    rank: int
    targets: tuple[str, ...]
    nbytes: int
    source: str  # "shipped" | "trained" | a path


class _SlotsView(QWidget):
    """Device slots as boxes in their adapter's colour (empty ones outlined), host-memory adapters after."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.slots: tuple[str | None, ...] = ()
        self.host: tuple[str, ...] = ()
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(self.sizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        h = self.fontMetrics().height()
        return QSize(300, 2 * (h + 14) + 6)

    def set_state(self, slots: tuple[str | None, ...], host: tuple[str, ...]) -> None:
        self.slots, self.host = slots, host
        self.setMinimumHeight(self.sizeHint().height())
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        pal = self.palette()
        fm = self.fontMetrics()
        row_h = fm.height() + 10
        text = pal.color(QPalette.ColorRole.Text)
        for row, (title, names) in enumerate((("device", self.slots), ("host", self.host))):
            y = 2 + row * (row_h + 4)
            p.setPen(text)
            title_w = fm.horizontalAdvance("device ") + 6
            p.drawText(QRectF(0, y, title_w, row_h), Qt.AlignmentFlag.AlignVCenter, title)
            if not names:
                p.drawText(QRectF(title_w, y, self.width() - title_w, row_h), Qt.AlignmentFlag.AlignVCenter,
                           "no slots" if row == 0 else "none")
                continue
            box_w = max(36.0, (self.width() - title_w) / max(len(names), 1) - 4)
            for i, name in enumerate(names):
                rect = QRectF(title_w + i * (box_w + 4), y, box_w, row_h)
                if name is None:
                    p.setPen(pal.color(QPalette.ColorRole.Mid))
                    p.drawRect(rect)
                    p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "empty")
                    continue
                p.fillRect(rect, adapter_color(name))
                p.setPen(Qt.GlobalColor.black)
                p.drawText(rect, Qt.AlignmentFlag.AlignCenter, fm.elidedText(name, Qt.TextElideMode.ElideRight,
                                                                           int(box_w) - 4))


class LoraPanel(Panel):
    sigAskAll = Signal(str)  # one prompt for the base model and every adapter, in one batch

    def __init__(self, parent: QWidget | None = None, max_steps: int = 300) -> None:
        super().__init__(parent)
        self._adapters: dict[str, AdapterRow] = {}
        self._pool: LoraPoolSnapshot | None = None
        self._events: deque[LoraPoolEvent] = deque(maxlen=MAX_EVENTS_SHOWN)
        self._steps: deque[tuple[int, dict[str | None, int]]] = deque(maxlen=max_steps)
        self._seen: list[str | None] = []  # adapters in the order they first ran (the stacking order)
        self._answers: dict[str, tuple[str | None, QPlainTextEdit]] = {}  # request id -> (adapter, its box)
        self._pending_text: dict[str, str] = {}
        self._answer_min_h = 40

        self._summary = QLabel()
        self._summary.setTextFormat(Qt.TextFormat.RichText)
        self._summary.setWordWrap(True)
        self._slots = _SlotsView()
        self._event_log = QLabel()
        self._event_log.setTextFormat(Qt.TextFormat.RichText)
        self._event_log.setWordWrap(True)
        self._mix_plot = pg.PlotWidget()
        mp = self._mix_plot.getPlotItem()
        mp.setTitle("batch rows per step, by adapter")
        mp.setLabel("bottom", "engine step")
        mp.showGrid(x=False, y=True, alpha=0.25)
        mp.setMouseEnabled(x=False, y=False)
        mp.hideButtons()
        self._mix_plot.setMinimumHeight(80)
        self._curves: dict[str | None, pg.PlotDataItem] = {}
        self._mix_legend = QLabel()
        self._mix_legend.setTextFormat(Qt.TextFormat.RichText)
        self._mix_legend.setWordWrap(True)

        self._question = QLineEdit(DEFAULT_QUESTION)
        self._question.returnPressed.connect(self._on_ask)
        self._ask = QPushButton("Ask every adapter")
        self._ask.setToolTip("Send this prompt to the base model and to every adapter at once: one batch, "
                             "each row with its own adapter")
        self._ask.clicked.connect(self._on_ask)
        ask_row = QGridLayout()
        ask_row.addWidget(self._question, 0, 0)
        ask_row.addWidget(self._ask, 0, 1)
        self._grid = QGridLayout()
        self._grid.setSpacing(4)
        self._answers_hint = QLabel("One prompt, every adapter: the answers appear side by side here.")
        self._answers_hint.setWordWrap(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._summary)
        layout.addWidget(self._slots)
        layout.addWidget(self._event_log)
        layout.addWidget(self._mix_legend)
        layout.addWidget(self._mix_plot, 2)
        layout.addLayout(ask_row)
        layout.addWidget(self._answers_hint)
        layout.addLayout(self._grid, 3)
        self._on_palette_changed()
        self._update_overlay()

    # --- setters ------------------------------------------------------------------------------
    def set_adapters(self, rows: list[AdapterRow]) -> None:
        self._adapters = {r.name: r for r in rows}
        self._ask.setEnabled(bool(rows))
        self._mark_dirty()
        self._update_overlay()

    def add_step(self, stats: StepStats, events: tuple[LoraPoolEvent, ...], pool: LoraPoolSnapshot | None) -> None:
        if pool is not None:
            self._pool = pool
        self._events.extend(events)
        rows: dict[str | None, int] = {}
        for name in stats.scheduled_loras:
            rows[name] = rows.get(name, 0) + 1
            if name not in self._seen:
                self._seen.append(name)
        if pool is not None or rows:
            self._steps.append((stats.step, rows))
            self._mark_dirty()
        if pool is not None and not self._unavailable_reason and self.overlay_text():
            self._update_overlay()

    def set_presenter_scale(self, scale: float) -> None:
        """Larger text needs a taller plot and taller answer boxes: they keep a readable height."""
        super().set_presenter_scale(scale)
        self._mix_plot.setMinimumHeight(int(80 * scale))
        self._answer_min_h = int(40 * scale)
        for _name, box in self._answers.values():
            box.setMinimumHeight(self._answer_min_h)

    def begin_side_by_side(self, assignments: dict[str, str | None]) -> None:
        """New answer boxes: request id -> the adapter it runs with (None: the base model)."""
        while self._grid.count():
            item = self._grid.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self._answers.clear()
        self._pending_text.clear()
        cols = min(4, max(1, len(assignments)))
        for i, (rid, name) in enumerate(assignments.items()):
            title = QLabel(chip(name))
            title.setTextFormat(Qt.TextFormat.RichText)
            box = QPlainTextEdit()
            box.setReadOnly(True)
            box.setMinimumHeight(self._answer_min_h)
            box.setStyleSheet(f"QPlainTextEdit {{ border: 2px solid {adapter_color(name).name()}; }}")
            r, c = divmod(i, cols)
            self._grid.addWidget(title, 2 * r, c)
            self._grid.addWidget(box, 2 * r + 1, c)
            self._answers[rid] = (name, box)
        self._answers_hint.hide()

    def wants(self, request_id: str) -> bool:
        return request_id in self._answers

    def append_answer(self, request_id: str, text: str) -> None:
        if request_id in self._answers and text:
            self._pending_text[request_id] = self._pending_text.get(request_id, "") + text
            self._mark_dirty()

    def reset(self) -> None:
        self._pool = None
        self._adapters.clear()  # the source says again which adapters the engine has (after a reset)
        self._events.clear()
        self._steps.clear()
        self._seen.clear()
        for curve in self._curves.values():
            self._mix_plot.getPlotItem().removeItem(curve)
        self._curves.clear()
        self._mark_dirty()
        self._update_overlay()
        self.flush()

    def snapshot_data(self) -> dict:
        pool = self._pool
        return {
            "adapters": sorted(self._adapters), "device_slots": list(pool.device_slots) if pool else [],
            "host": list(pool.host) if pool else [],
            "hits": pool.num_hits if pool else 0, "loads": pool.num_loads if pool else 0,
            "evictions": pool.num_evictions if pool else 0,
            "events": [(e.kind, e.name) for e in self._events], "num_steps": len(self._steps),
            "rows_by_adapter": {_label(n): sum(r.get(n, 0) for _s, r in self._steps) for n in self._seen},
            "answers": {rid: (_label(name), box.toPlainText()) for rid, (name, box) in self._answers.items()},
            "summary": self._summary.text(),
        }

    # --- internals ----------------------------------------------------------------------------
    def _off_text(self) -> str:
        return "" if self._pool is not None or self._adapters else OFF_TEXT

    def _repaint(self) -> None:
        pool = self._pool
        if pool is not None:
            self._summary.setText(
                f"<b>{len(pool.device_slots)}</b> device slots · <b>{len(pool.host)}</b> in host memory · "
                f"hits <b>{pool.num_hits}</b> · loads <b>{pool.num_loads}</b> · "
                f"evictions <b>{pool.num_evictions}</b>")
            self._summary.setToolTip(
                f"device slots: {human_bytes(pool.device_bytes)} (preallocated) · host: {human_bytes(pool.host_bytes)}"
                + "".join(f"\n{r.name}: rank {r.rank}, {', '.join(r.targets)}, {human_bytes(r.nbytes)} ({r.source})"
                          for r in self._adapters.values()))
            self._slots.set_state(pool.device_slots, pool.host)
        self._event_log.setText("recent: " + (" · ".join(self._describe(e) for e in reversed(self._events))
                                               or "no loads or evictions yet"))
        self._draw_mix()
        slots = set(pool.device_slots) if pool is not None else set()
        for name, box in self._answers.values():  # an adapter without a slot waits for one: say so
            box.setPlaceholderText("waiting for a device slot…" if name and pool is not None and name not in slots
                                   else "")
        for rid, text in self._pending_text.items():
            box = self._answers[rid][1]
            box.moveCursor(box.textCursor().MoveOperation.End)
            box.insertPlainText(text)
        self._pending_text.clear()

    @staticmethod
    def _describe(e: LoraPoolEvent) -> str:
        where = {"load": f"→ slot {e.slot} ({e.source}, {e.seconds * 1e3:.0f} ms)", "evict": f"from slot {e.slot}",
                 "drop": "to disk", "added": "", "removed": ""}
        return f"{e.kind} {chip(e.name)} {where.get(e.kind, '')}".rstrip()

    def _draw_mix(self) -> None:
        if not self._steps:
            return
        x = np.fromiter((s for s, _r in self._steps), dtype=float)
        top = np.zeros(len(x))
        tops = {}
        for name in self._seen:  # cumulative: each adapter's band sits on the ones before it
            top = top + np.fromiter((r.get(name, 0) for _s, r in self._steps), dtype=float)
            tops[name] = top
        plot = self._mix_plot.getPlotItem()
        for name in reversed(self._seen):  # back to front: the tallest cumulative curve first
            curve = self._curves.get(name)
            if curve is None:
                color = adapter_color(name)
                fill = adapter_color(name)
                fill.setAlpha(170)
                curve = pg.PlotDataItem(pen=pg.mkPen(color, width=1), fillLevel=0, brush=fill)
                self._curves[name] = curve
                curve.setZValue(-self._seen.index(name))  # later adapters' taller bands behind earlier ones
                plot.addItem(curve)
            curve.setData(x, tops[name])
        self._mix_legend.setText(" ".join(chip(n) for n in self._seen))

    def _on_ask(self) -> None:
        text = self._question.text().strip()
        if text:
            self.sigAskAll.emit(text)

    def _on_palette_changed(self) -> None:
        style_plot(self._mix_plot, self.palette())
