"""HoverTips: the mouse handling shared by the cell views (block map, Gantt chart, error heatmap)."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF
from PySide6.QtWidgets import QToolTip


class HoverTips:
    """Mixin for a QWidget (list it first): tool tips come from `tooltip_at(QPoint)` ("" hides them);
    a view that defines `hover_key(QPointF)` gets the key under the mouse in `self._hover`, repainted
    when it changes and cleared when the mouse leaves (call setMouseTracking(True))."""

    _hover = None

    def hover_key(self, pos: QPointF):
        return None

    def mouseMoveEvent(self, event) -> None:  # noqa: N802 (Qt override)
        key = self.hover_key(event.position())
        if key != self._hover:
            self._hover = key
            self.update()

    def leaveEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if self._hover is not None:
            self._hover = None
            self.update()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            text = self.tooltip_at(event.pos())
            if text:
                QToolTip.showText(event.globalPos(), text, self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)
