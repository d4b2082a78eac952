"""CaptionBanner: the title and caption of the current preset, large in presenter mode."""
from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from widgets.theme import PHASE_COLORS

_NORMAL_PT = (13.0, 10.0)  # (title, caption) point sizes
_COMPACT_PT = (11.0, 9.0)  # the normal window on a small screen: the caption leaves the panels their lines
_PRESENTER_PT = (24.0, 17.0)


class CaptionBanner(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        self.setBackgroundRole(QPalette.ColorRole.AlternateBase)
        self._presenter = False
        self._compact = False
        self._screen_scale = 1.0  # presenter fonts for a 1080-line screen, scaled to the one in use
        self._title = QLabel()
        self._caption = QLabel()
        self._caption.setWordWrap(True)
        self._cue = QLabel()  # the preset's scripted moment that just happened ("▶ a burst of long prompts")
        self._cue.setWordWrap(True)
        self._cue.setVisible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        layout.addWidget(self._title)
        layout.addWidget(self._caption)
        layout.addWidget(self._cue)
        self._apply_fonts()
        self.reset()

    def set_caption(self, title: str, caption: str) -> None:
        self._title.setText(title)
        self._caption.setText(caption)
        self._title.setVisible(bool(title))
        self._caption.setVisible(bool(caption))
        self.updateGeometry()

    def set_cue(self, text: str) -> None:
        """The cue that just played, highlighted under the caption ("" hides the line)."""
        self._cue.setText(f"▶ {text}" if text else "")
        self._cue.setVisible(bool(text))

    def set_presenter(self, presenter: bool, screen_height: int = 1080) -> None:
        """Presenter sizes are for a 1080-line projector; a 720-line one gets them scaled down, so the
        caption leaves the charts the room they need."""
        self._presenter = presenter
        self._screen_scale = min(1.0, max(0.6, screen_height / 1080))
        self._apply_fonts()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """As tall as the text wrapped at the banner's own width: the toolbar holding it asks for a size
        hint only, which Qt computes for a narrower label, so a long caption got several empty lines."""
        hint = super().sizeHint()
        if self.width() > 100:
            hint.setHeight(self.layout().totalHeightForWidth(self.width()))
        return hint

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        hint = super().minimumSizeHint()
        if self.width() > 100:
            hint.setHeight(self.layout().totalHeightForWidth(self.width()))
        return hint

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.updateGeometry()  # a new width wraps the caption to another height

    def set_compact(self, compact: bool) -> None:
        self._compact = compact
        self.layout().setContentsMargins(*((8, 4, 8, 4) if compact else (12, 8, 12, 8)))
        self.layout().setSpacing(2 if compact else 4)
        self._apply_fonts()

    def reset(self) -> None:
        self.set_caption("", "")
        self.set_cue("")

    def snapshot_data(self) -> dict:
        return {"title": self._title.text(), "caption": self._caption.text(),
                "cue": self._cue.text(), "presenter": self._presenter}

    def _apply_fonts(self) -> None:
        title_pt, caption_pt = ((p * self._screen_scale for p in _PRESENTER_PT) if self._presenter
                                else _COMPACT_PT if self._compact else _NORMAL_PT)
        font = self.font()
        font.setPointSizeF(title_pt)
        font.setBold(True)
        self._title.setFont(font)
        font.setPointSizeF(caption_pt)
        font.setBold(False)
        self._caption.setFont(font)
        font.setBold(True)
        self._cue.setFont(font)
        self._cue.setStyleSheet(f"color: {PHASE_COLORS['prefill']}")  # a moment, not the caption
