"""The replay bar: paused / 1x / 2x / 4x, a scrubber over the recording's length, jumps to each knob change,
and what the recording is ("recorded on <machine>, <date>"). Shown while a ReplaySource feeds the panels."""
from __future__ import annotations

from functools import partial

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QLabel, QMenu, QSlider, QToolBar, QToolButton

from app.replay.clock import SPEEDS

SLIDER_STEPS_PER_S = 10


class ReplayBar(QToolBar):
    sigState = Signal(object)  # ReplayState, delivered in the GUI thread whichever thread the source emits from

    def __init__(self, window) -> None:
        super().__init__("Replay", window)
        self.sigState.connect(self.show_state)
        self.setObjectName("replay-bar")
        self.setMovable(False)
        self.source = None
        self._dragging = False
        group = QActionGroup(self)
        self.speed_actions: dict[float, QAction] = {}
        for speed in SPEEDS:
            action = QAction("pause" if speed == 0 else f"{speed:g}×", self)
            action.setCheckable(True)
            action.setToolTip("paused" if speed == 0 else f"play at {speed:g}× the recorded pace")
            action.triggered.connect(lambda _c=False, s=speed: self.source and self.source.set_speed(s))
            group.addAction(action)
            self.addAction(action)
            self.speed_actions[speed] = action
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setToolTip("the recording's timeline: drag to play from there")
        self.slider.sliderPressed.connect(lambda: setattr(self, "_dragging", True))
        self.slider.sliderReleased.connect(self._on_released)
        self.addWidget(self.slider)
        self.position_label = QLabel("")
        self.addWidget(self.position_label)
        self.jumps = QToolButton()
        self.jumps.setText("knob changes")
        self.jumps.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.jumps.setMenu(QMenu(self.jumps))
        self.jumps.setToolTip("jump to a moment the recorded run turned a knob")
        self.addWidget(self.jumps)
        self.about = QLabel("")
        self.addWidget(self.about)
        self._marks: tuple = ()

    def follow(self, source) -> None:
        """Show and drive `source` (a ReplaySource); None hides the bar."""
        if self.source is not None:
            self.source.sigReplayState.disconnect(self._state_from_source)
        self.source = source
        self.setVisible(source is not None)
        if source is not None:
            source.sigReplayState.connect(self._state_from_source)
            self.show_state(source.state())

    def _state_from_source(self, state) -> None:
        """The source's notice, in its worker's thread: queued to this bar's thread as a signal."""
        self.sigState.emit(state)

    def show_state(self, state) -> None:
        self.speed_actions.get(state.speed, self.speed_actions[1.0]).setChecked(True)
        if state.duration is not None:
            self.slider.setRange(0, max(1, round(state.duration * SLIDER_STEPS_PER_S)))
        if not self._dragging:
            self.slider.setValue(round(state.position * SLIDER_STEPS_PER_S))
        total = f"{state.duration:.1f}" if state.duration is not None else "…"
        self.position_label.setText(f" {state.position:.1f} / {total} s" + ("  (end)" if state.ended else ""))
        self.about.setText(f"  {state.recorded_on}" + (f"  ·  {state.note}" if state.note else ""))
        self.about.setToolTip(state.note)
        if state.knob_marks != self._marks:
            self._marks = state.knob_marks
            menu = self.jumps.menu()
            menu.clear()
            for t, text in state.knob_marks:
                menu.addAction(f"{t:.1f} s: {text}", partial(self._seek, t))
            self.jumps.setEnabled(bool(state.knob_marks))
            self.jumps.setText(f"knob changes ({len(state.knob_marks)})")

    def _on_released(self) -> None:
        self._dragging = False
        self._seek(self.slider.value() / SLIDER_STEPS_PER_S)

    def _seek(self, t: float) -> None:
        if self.source is not None:
            self.source.seek(t)
