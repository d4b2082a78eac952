"""GanttView: one row per request over the last N seconds: queued, prefill chunks, decode, preempted.

Fed from the same events as the timeline: arrivals, each step's `scheduled` list (its time span is
[t_start, t_start + wall_time_s]) and finishes. Consecutive decode/verify steps merge into one bar;
prefill chunks stay separate so chunked prefill is visible. A request that goes back to prefill after
decoding (recompute after preemption), or that `request_preempted` names, shows the gap as preempted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QPoint, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from engine.events import StepKind, StepStats
from widgets.hover_tips import HoverTips
from widgets.theme import FINISH_COLORS, adapter_color, phase_color, request_color

MERGE_GAP_S = 0.1  # decode steps closer than this draw as one bar
PRUNE_EVERY_S = 0.25  # add_span drops finished rows out of the window at most this often
_LABEL_W = 78
_AXIS_H = 16
_MIN_ROW_H, _MAX_ROW_H = 3, 18


@dataclass(slots=True)
class _Row:
    request_id: str
    arrival: float
    segments: list[list] = field(default_factory=list)  # [t0, t1, kind]
    preempted_at: float | None = None
    finished: float | None = None
    reason: str | None = None
    adapter: str | None = None  # the LoRA adapter the request runs with (None: the base model)


class GanttView(HoverTips, QWidget):
    def __init__(self, parent: QWidget | None = None, window_s: float = 20.0, max_rows: int = 48) -> None:
        super().__init__(parent)
        self._window_s = window_s
        self._max_rows = max_rows
        self._rows: dict[str, _Row] = {}
        self._now = 0.0
        self._adapters_seen = False  # any row ran with a LoRA adapter: rows carry their adapter's colour
        self._pruned_at = 0.0
        self._reused = 0  # finished rows moved aside when their id came back
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumHeight(80)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(500, 180)

    # --- data ---------------------------------------------------------------------------------
    def set_window(self, seconds: float) -> None:
        self._window_s = max(1.0, seconds)
        self.update()

    def reset(self) -> None:
        self._rows.clear()
        self._now = self._pruned_at = 0.0
        self._adapters_seen = False
        self.update()

    def request_arrived(self, request_id: str, t: float) -> None:
        self._live_row(request_id, t)
        self._advance(t)

    def _live_row(self, request_id: str, t: float) -> _Row:
        """The request's row. A finished request's id seen again is another request (a recording of a
        comparison's rounds, prepare's, reuses its ids round after round): it gets a row of its own, and the
        finished one stays under another key until it scrolls out, instead of drawing the gap between the
        rounds as a preemption."""
        row = self._rows.get(request_id)
        if row is not None and row.finished is not None:
            self._reused += 1
            self._rows[f"{request_id}#{self._reused}"] = self._rows.pop(request_id)
            row = None
        if row is None:
            row = self._rows[request_id] = _Row(request_id, t)
        return row

    def request_preempted(self, request_id: str, t: float) -> None:
        row = self._rows.get(request_id)
        if row is not None:
            row.preempted_at = t
        self._advance(t)

    def request_finished(self, request_id: str, t: float, reason: str | None) -> None:
        row = self._rows.setdefault(request_id, _Row(request_id, t))
        row.finished, row.reason = t, reason
        self._advance(t)

    def add_step(self, stats: StepStats) -> None:
        t0, t1 = stats.t_start, stats.t_start + stats.wall_time_s
        loras = stats.scheduled_loras or (None,) * len(stats.scheduled)
        for (request_id, _num_tokens, kind), adapter in zip(stats.scheduled, loras, strict=False):
            row = self._live_row(request_id, t0)
            if adapter:
                row.adapter = adapter
                self._adapters_seen = True
            last = row.segments[-1] if row.segments else None
            if kind == StepKind.PREFILL and last is not None and last[2] in (StepKind.DECODE, StepKind.VERIFY):
                row.preempted_at = last[1] if row.preempted_at is None else row.preempted_at
            if row.preempted_at is not None:
                row.segments.append([row.preempted_at, t0, "preempted"])
                row.preempted_at = None
                last = None
            if last is not None and kind != StepKind.PREFILL and last[2] == kind and t0 - last[1] <= MERGE_GAP_S:
                last[1] = t1
            else:
                row.segments.append([t0, t1, kind])
        self._advance(t1)

    def add_span(self, request_id: str, t0: float, t1: float, kind: str) -> None:
        """A span of a request seen from outside the engine (an attached server's stream, measured by the
        client): merged with the row's last span of the same kind when they are close."""
        row = self._rows.setdefault(request_id, _Row(request_id, t0))
        last = row.segments[-1] if row.segments else None
        if last is not None and last[2] == kind and t0 - last[1] <= MERGE_GAP_S:
            last[1] = max(last[1], t1)
        else:
            row.segments.append([t0, t1, kind])
        if t1 - self._pruned_at >= PRUNE_EVERY_S:  # one call per arriving chunk: prune old rows now and then
            self._pruned_at = t1
            self._advance(t1)
        else:
            self._now = max(self._now, t1)

    def _advance(self, t: float) -> None:
        self._now = max(self._now, t)
        horizon = self._now - self._window_s
        for rid in [rid for rid, r in self._rows.items() if r.finished is not None and r.finished < horizon]:
            del self._rows[rid]

    def visible_rows(self) -> list[_Row]:
        horizon = self._now - self._window_s
        rows = [r for r in self._rows.values() if r.finished is None or r.finished >= horizon]
        rows.sort(key=lambda r: r.arrival)
        return rows[-self._max_rows:]

    def snapshot_data(self) -> dict:
        rows = self.visible_rows()
        return {"rows": [r.request_id for r in rows], "now": self._now, "window_s": self._window_s,
                "segments": {r.request_id: [tuple(s) for s in r.segments] for r in rows},
                "finished": {r.request_id: r.reason for r in rows if r.finished is not None},
                "adapters": {r.request_id: r.adapter for r in rows if r.adapter}}

    # --- geometry -----------------------------------------------------------------------------
    def _geometry(self, num_rows: int) -> tuple[float, float, float]:
        """(left x of the time area, px per second, row height)."""
        row_h = max(_MIN_ROW_H, min(_MAX_ROW_H, (self.height() - _AXIS_H) / max(1, num_rows)))
        left = _LABEL_W if row_h >= 10 else 0
        return left, (self.width() - left - 4) / self._window_s, row_h

    def _x(self, t: float, left: float, px_per_s: float) -> float:
        return left + (t - (self._now - self._window_s)) * px_per_s

    def tooltip_at(self, pos: QPoint) -> str:
        rows = self.visible_rows()
        left, px_per_s, row_h = self._geometry(len(rows))
        index = int(pos.y() // row_h)
        if not 0 <= index < len(rows):
            return ""
        row = rows[index]
        t = self._now - self._window_s + (pos.x() - left) / px_per_s
        kind = next((s[2] for s in row.segments if s[0] <= t <= s[1]), None)
        if kind is None:
            first = row.segments[0][0] if row.segments else None
            kind = "queued" if first is None or t < first else "waiting (not scheduled)"
        done = f"\nfinished: {row.reason}" if row.finished is not None else ""
        lora = f"\nLoRA adapter: {row.adapter or 'none (base model)'}" if self._adapters_seen else ""
        return f"{row.request_id}{lora}\n{kind} at {t - self._now:+.2f} s{done}"

    # --- painting -----------------------------------------------------------------------------
    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        rows = self.visible_rows()
        if not rows:
            p.setPen(pal.color(QPalette.ColorRole.Text))
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "no requests in the last "
                       f"{self._window_s:.0f} s")
            return
        left, px_per_s, row_h = self._geometry(len(rows))
        p.setClipRect(QRectF(left, 0, self.width() - left, self.height()))
        for i, row in enumerate(rows):
            self._paint_row(p, row, i * row_h, row_h, left, px_per_s)
        p.setClipping(False)
        if self._adapters_seen:  # multi-LoRA: a stripe in each row's adapter colour (grey: the base model)
            for i, row in enumerate(rows):
                p.fillRect(QRectF(max(left - 5, 0), i * row_h + 1, 4, max(row_h - 2, 1)), adapter_color(row.adapter))
        if left:
            for i, row in enumerate(rows):
                p.setPen(adapter_color(row.adapter) if self._adapters_seen else request_color(row.request_id))
                p.drawText(QRectF(2, i * row_h, left - 6, row_h),
                           Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, row.request_id)
        self._paint_axis(p, left, px_per_s)

    def _paint_row(self, p: QPainter, row: _Row, y: float, h: float, left: float, px_per_s: float) -> None:
        pad = 1 if h >= 6 else 0
        top, bar_h = y + pad, h - 2 * pad
        end = row.finished if row.finished is not None else self._now
        x = lambda t: self._x(t, left, px_per_s)  # noqa: E731
        # a thin line while the request is in the system but not scheduled
        p.fillRect(QRectF(x(row.arrival), top + bar_h / 2 - 0.5, x(end) - x(row.arrival), 1),
                   self.palette().color(QPalette.ColorRole.Mid))
        first = row.segments[0][0] if row.segments else end
        queued = phase_color("queued")
        queued.setAlpha(110)
        p.fillRect(QRectF(x(row.arrival), top, max(1.0, x(first) - x(row.arrival)), bar_h), queued)
        edge = QPen(self.palette().color(QPalette.ColorRole.Base), 1)
        for t0, t1, kind in row.segments:
            rect = QRectF(x(t0), top, max(1.5, x(t1) - x(t0)), bar_h)
            p.fillRect(rect, phase_color(kind))
            if kind == "prefill" and bar_h >= 4:  # separate adjacent chunks
                p.setPen(edge)
                p.drawLine(rect.topRight(), rect.bottomRight())
        if row.finished is not None:
            p.fillRect(QRectF(x(row.finished) - 1.5, y, 3, h), QColor(FINISH_COLORS.get(row.reason or "", "#59a14f")))

    def _paint_axis(self, p: QPainter, left: float, px_per_s: float) -> None:
        pal = self.palette()
        y = self.height() - _AXIS_H
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.drawLine(int(left), y, self.width(), y)
        step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300) if s * px_per_s >= 50 or s == 300)
        p.setPen(pal.color(QPalette.ColorRole.Text))
        k = 0
        while k * step <= self._window_s and self.width() - 4 - k * step * px_per_s >= left + 20:
            xx = self.width() - 4 - k * step * px_per_s
            p.drawLine(int(xx), y, int(xx), y + 3)
            x0 = min(max(xx - 30, left), self.width() - 60)
            p.drawText(QRectF(x0, y + 2, 60, _AXIS_H - 2), Qt.AlignmentFlag.AlignCenter,
                       "now" if k == 0 else f"-{k * step} s")
            k += 1

