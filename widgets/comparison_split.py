"""Where each request's time went, for one configuration: a stacked bar per request, queue / prefill /
decode in the timeline's phase colours, all on one time scale, the total written at the end."""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

from widgets.theme import phase_color

PHASES = (("queue_ms", "queued", "queue"), ("prefill_ms", "prefill", "prefill"), ("decode_ms", "decode", "decode"))


class SplitChart(QWidget):
    def __init__(self, parent: QWidget | None = None, point_size: int = 13) -> None:
        super().__init__(parent)
        self._title = ""
        self._requests: list[dict] = []
        self._font = QFont(self.font())
        self._font.setPointSize(point_size)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_point_size(self, point_size: int) -> None:
        self._font.setPointSize(point_size)
        self.set_requests(self._title, self._requests)

    def set_requests(self, title: str, requests: list[dict]) -> None:
        """requests: [{"id", "queue_ms", "prefill_ms", "decode_ms"}, ...] (one configuration)."""
        self._title, self._requests = title, list(requests)
        line = QFontMetrics(self._font).height()
        self.setFixedHeight(int(line * 2.4 + len(self._requests) * line * 0.9) + 8)
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        p.setFont(self._font)
        fm, text = QFontMetrics(self._font), self.palette().text().color()
        line, w = fm.height(), self.width()
        p.setPen(text)
        p.drawText(QRectF(0, 0, w, line), Qt.AlignmentFlag.AlignLeft, self._title)
        x = 0
        for _key, phase, name in PHASES:  # legend, above the bars
            p.fillRect(QRectF(x, line * 1.2, line * 0.8, line * 0.8), phase_color(phase))
            p.drawText(QRectF(x + line, line * 1.05, w, line), Qt.AlignmentFlag.AlignLeft, name)
            x += line + fm.horizontalAdvance(name) + 24
        totals = [sum(r.get(k) or 0.0 for k, _, _ in PHASES) for r in self._requests]
        top = max(totals, default=0.0) or 1.0
        value_w = fm.horizontalAdvance("99,999 ms") + 12
        bar_w = max(10, w - value_w)
        y = line * 2.3
        row = line * 0.9
        for r, total in zip(self._requests, totals):
            bx = 0.0
            for key, phase, _ in PHASES:
                length = bar_w * (r.get(key) or 0.0) / top
                p.fillRect(QRectF(bx, y + 1, length, row - 3), phase_color(phase))
                bx += length
            p.setPen(text)
            align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
            p.drawText(QRectF(bx + 6, y - 2, value_w, row + 2), align, f"{total:,.0f} ms")
            y += row
        p.end()
