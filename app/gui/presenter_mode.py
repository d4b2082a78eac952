"""PresenterMode: the window's projector state (F11). Larger fonts and charts, the caption banner large,
only the preset's panels side by side (app/gui/presenter_layout.py arranges them), the status bar off the
projector; leaving it restores the fonts and the layout from before."""
from __future__ import annotations

from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication, QDockWidget, QMainWindow

from app.gui.presenter_layout import (
    PRESENTER_COMPARISON_SHARE,
    PRESENTER_FONT_SCALE,
    PRESENTER_PLOT_SCALE,
    arrange_columns,
    give_comparison_room,
    presenter_scale,
)
from widgets.panel_base import Panel

REBALANCE_MS = 1500  # how often the comparison's share of its column is checked (texts grow as figures arrive)


class PresenterMode(QObject):
    def __init__(self, window: QMainWindow, state_version: int) -> None:
        super().__init__(window)
        self._window = window
        self._state_version = state_version
        self.on = False
        self._full_screen = False  # full screen (not a headless screenshot at a given size)
        self._screen_h = 0  # the projector's lines
        self._normal_font: QFont | None = None
        self._layout_before = None
        self._shown: tuple[str, ...] = ()  # the preset's panels
        self.columns: list[list[QDockWidget]] = []
        self._room_timer = QTimer(self)
        self._room_timer.setInterval(REBALANCE_MS)
        self._room_timer.timeout.connect(self.give_comparison_room)
        window.panels.comparison.sigShown.connect(lambda: QTimer.singleShot(0, self.give_comparison_room))

    def set(self, on: bool, full_screen: bool = True, screen_height: int | None = None) -> None:
        """Enter or leave; full screen unless `full_screen` is False (headless screenshots at a given
        projector size)."""
        w, app = self._window, QApplication.instance()
        if on == self.on:
            return
        self.on = on
        # the projector's lines: the screen's when full screen, else the size asked for (a headless
        # screenshot; the window itself may not have shrunk to it yet)
        screen_h = w.screen().size().height() if full_screen else (screen_height or w.height())
        self._screen_h = screen_h
        if on:
            self._layout_before = w.saveState(self._state_version)
            self._normal_font = app.font()
            font = QFont(self._normal_font)
            font.setPointSizeF(self._normal_font.pointSizeF() * presenter_scale(PRESENTER_FONT_SCALE, screen_h))
            app.setFont(font)
            w.caption_bar.show()
            w.statusBar().hide()  # for the room: the cue shows under the caption, the rest is the speaker's
            self._full_screen = full_screen
            if full_screen:
                w.showFullScreen()
        else:
            if self._normal_font is not None:
                app.setFont(self._normal_font)
            w.statusBar().show()
            w.showNormal()
            if self._layout_before is not None:
                w.restoreState(self._layout_before, self._state_version)
        w.caption.set_presenter(on, screen_h)
        plot_scale = presenter_scale(PRESENTER_PLOT_SCALE, screen_h) if on else 1.0
        for panel in w.panels.values():  # the charts too, not only the caption: fonts, lines, markers
            if isinstance(panel, Panel):
                panel.set_presenter_scale(plot_scale)
        w.panels.comparison.set_chart_first(on)
        w.panels.comparison.setMinimumHeight(int(PRESENTER_COMPARISON_SHARE * screen_h) if on else 0)
        self.show_panels(self._shown)

    def show_panels(self, names: tuple[str, ...]) -> None:
        """Only the preset's panels stay on screen, side by side (no tabs: nothing the room should see hides
        behind another), the first named on the left."""
        self._shown = tuple(names)
        if not (self.on and self._shown):
            return
        w = self._window
        w.restoreState(w.default_state, self._state_version)  # the same start for every preset's arrangement
        # the sliders stay off the projector (keys and the preset's cues turn the knobs; the panels show it)
        shown = [n for n in self._shown if n != "controls"] or list(self._shown)
        docks = [w.docks[n] for n in shown if n in w.docks]
        for name, dock in w.docks.items():
            dock.setVisible(name in shown)
        self.columns = arrange_columns(w, docks)
        self._room_timer.start()
        if self._full_screen:  # the screen's size, also where no window manager applies full screen
            QTimer.singleShot(0, self._fit_screen)  # once the new layout's minimum is known
        else:
            QTimer.singleShot(0, self.give_comparison_room)

    def _keep_to_screen(self) -> None:
        """A layout that needed more lines for a moment (fonts enlarged, a table before it was fitted)
        grew the window past the projector; once it fits again, the window goes back to the screen's
        lines, so nothing the room should see is below the bottom edge."""
        w = self._window
        if self.on and not self._full_screen and self._screen_h and w.height() > self._screen_h \
                and w.minimumSizeHint().height() <= self._screen_h:
            w.resize(w.width(), self._screen_h)

    def _fit_screen(self) -> None:
        if self.on and self._full_screen:
            self._window.setGeometry(self._window.screen().geometry())
            QTimer.singleShot(0, self.give_comparison_room)  # once the docks have the screen's height

    def give_comparison_room(self) -> None:
        self._keep_to_screen()
        if self.on and self._shown:
            give_comparison_room(self._window, self.columns, self._window.docks["comparison"])
        elif self._room_timer.isActive():
            self._room_timer.stop()
