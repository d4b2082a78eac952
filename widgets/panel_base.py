"""Panel: the shared skeleton of every monitor panel.

Setters only record data and mark the panel dirty; a timer (~20 Hz, slower when the app's frame
governor says so) repaints when (and only when)
something changed and the panel is visible. This keeps a step from ever waiting on a repaint and
keeps per-token events from turning into per-token paints.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QTimer
from PySide6.QtWidgets import QLabel, QScrollArea, QWidget

from widgets.overlay import Overlay
from widgets.presenter import clipped_texts, fit_texts, legends_outside, scale_plots

REPAINT_INTERVAL_MS = 50  # 20 Hz


def fit_wrapped_labels(root: QWidget) -> None:
    """Each word-wrapped label in `root` at least as tall as its text at its width: a layout asks a label
    only for its minimum size, not its height for the width it gets, so a short dock squeezed wrapped
    lines into the next label (text over text); now the panel's least height is what its text needs."""
    for label in root.findChildren(QLabel):
        if label.wordWrap() and label.isVisibleTo(root) and label.width() > 0:
            need = label.heightForWidth(label.width())
            if need > 0 and label.minimumHeight() != need:
                label.setMinimumHeight(need)


class Panel(QWidget):
    PRESENTER_PLOT_PX = 80  # each plot's least height in presenter mode, times the scale (panels may raise it)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._dirty = False
        self._overlay = Overlay(self)
        self._unavailable_reason = ""
        self._presenter_scale = 1.0
        self._legends_placed = False
        self._repaint_timer = QTimer(self)
        self._repaint_timer.setInterval(REPAINT_INTERVAL_MS)
        self._repaint_timer.timeout.connect(self._on_repaint_timer)

    # --- public -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Repaint now if anything changed (the timer does this; tests and screenshots call it)."""
        if self._dirty:
            self._dirty = False
            self._repaint()
            fit_texts(self, self._presenter_scale)  # new titles, or a dock resized: fit them to their room

    def set_repaint_interval(self, ms: int, phase_ms: int = 0) -> None:
        """How often the timer repaints (the app slows it when the GUI's CPU time would slow the engine).
        `phase_ms` delays the restart, so panels given different phases paint at different moments
        instead of all in one long pass of the event loop."""
        self._repaint_timer.setInterval(max(1, int(ms)))
        if self._repaint_timer.isActive() and phase_ms > 0:
            self._repaint_timer.stop()
            QTimer.singleShot(int(phase_ms), self, self._start_if_visible)

    def _start_if_visible(self) -> None:
        if self.isVisible():
            self._repaint_timer.start()

    def set_available(self, available: bool, why: str = "") -> None:
        """Grey the panel out under a message, e.g. set_available(False, "needs a GPU")."""
        self._unavailable_reason = "" if available else (why or "not available")
        self._update_overlay()

    def is_available(self) -> bool:
        return not self._unavailable_reason

    def overlay_text(self) -> str:
        """What the overlay shows ("" when the panel shows its data)."""
        return self._overlay.text()

    def set_presenter_scale(self, scale: float) -> None:
        """Enlarge (or restore, scale 1) the plots' fonts, lines, markers and legends for a projector; each
        plot keeps a readable least height there (panels with plots of their own sizes set them after)."""
        self._presenter_scale = scale
        scale_plots(self, scale)
        for plot in self.findChildren(pg.PlotWidget):
            plot.setMinimumHeight(int(self.PRESENTER_PLOT_PX * scale) if scale > 1 else 0)
        self._mark_dirty()

    def presenter_scale(self) -> float:
        return self._presenter_scale

    def clipped_texts(self) -> list[str]:
        """Texts on this panel cut by the room they have ([] when every title and label fits)."""
        return clipped_texts(self)

    def reset(self) -> None:
        raise NotImplementedError

    def snapshot_data(self) -> dict:
        raise NotImplementedError

    # --- for subclasses -----------------------------------------------------------------------
    def _mark_dirty(self) -> None:
        self._dirty = True

    def _repaint(self) -> None:
        """Push the buffered data into the visible items (setData, update())."""

    def _off_text(self) -> str:
        """A panel-specific "off" message ("" when on); shown unless a reason from set_available."""
        return ""

    def _update_overlay(self) -> None:
        self._overlay.set_text(self._unavailable_reason or self._off_text())

    def _on_palette_changed(self) -> None:
        """Restyle plots and cached colours after a theme switch."""

    # --- Qt plumbing --------------------------------------------------------------------------
    def _on_repaint_timer(self) -> None:
        self.flush()

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if not self._legends_placed:  # the subclass has made its plots and named their curves by now
            self._legends_placed = True
            legends_outside(self)
        self._repaint_timer.start()
        self.flush()
        super().showEvent(event)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self._mark_dirty()  # new room: titles (and at presenter scale axis labels) are fitted again
        super().resizeEvent(event)
        if isinstance(self.parentWidget() and self.parentWidget().parentWidget(), QScrollArea):
            fit_wrapped_labels(self)  # scrolled (the compact window): its height is its text's; elsewhere
            # the panel keeps the least height its layout gives (presenter mode fits docks to the screen)

    def hideEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self._repaint_timer.stop()
        super().hideEvent(event)

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.PaletteChange:
            self._on_palette_changed()
            self._dirty = True
        super().changeEvent(event)
