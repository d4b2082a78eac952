"""A translucent message that covers a panel: "Speculative decoding: off", "not available: …"."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QWidget


class Overlay(QWidget):
    """Covers its parent (follows its size) and paints a centred message over a dimmed backdrop."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self._text = ""
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, False)
        parent.installEventFilter(self)
        self.hide()

    def text(self) -> str:
        return self._text

    def set_text(self, text: str) -> None:
        """Show `text` over the parent; an empty text hides the overlay."""
        self._text = text
        self.setVisible(bool(text))
        if text:
            self.setGeometry(self.parentWidget().rect())
            self.raise_()
            self.update()

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.parentWidget() and event.type() == QEvent.Type.Resize:
            self.setGeometry(self.parentWidget().rect())
        return False

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        bg = QColor(self.palette().color(QPalette.ColorRole.Window))
        bg.setAlpha(240)  # the panel's data shows through, dimmed; its text must not read as a second text
        p.fillRect(self.rect(), bg)
        font = p.font()
        font.setPointSizeF(font.pointSizeF() * 1.4)
        font.setBold(True)
        p.setFont(font)
        p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        p.drawText(self.rect().adjusted(12, 12, -12, -12),
                   Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self._text)
