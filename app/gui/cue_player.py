"""CuePlayer: plays the current preset's cues (app/talk/cues.py) while the audience watches.

A 4 Hz timer asks the preset's CueTimeline which cues are due; each one acts through the controller's own
verbs (a burst, a knob like a slider, the arrival rate) and says what happened where the room looks: the
caption's cue line, the status bar, and a labelled line on the timeline. N plays the next cue at once.
The clock starts when the preset is running on the engine, and stops with the load (R, Space).
"""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer

from app.talk.cues import Cue, CueTimeline

TICK_MS = 250


class CuePlayer(QObject):
    def __init__(self, controller) -> None:
        super().__init__(controller)
        self.controller = controller
        self.timeline: CueTimeline | None = None
        self._origin = 0.0  # perf_counter at timeline time 0
        self.played: list[str] = []  # what was played, for tests and the export
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._on_tick)

    def start(self, cues: tuple[Cue, ...], period_s: float) -> None:
        """Start the preset's timeline from 0 (nothing to do for a preset without cues)."""
        self.stop()
        self.timeline = CueTimeline(cues, period_s) if cues else None
        if self.timeline is not None:
            self._origin = time.perf_counter()
            self._timer.start()

    def stop(self) -> None:
        self._timer.stop()
        self.timeline = None
        self.controller.caption.set_cue("")

    @property
    def running(self) -> bool:
        return self._timer.isActive()

    def next_cue(self) -> bool:
        """Play the next cue now (the N key); the rest of the timeline keeps its spacing from here."""
        if self.timeline is None:
            self.controller.window.show_message("this preset has no cues")
            return False
        cue, at_s = self.timeline.next_cue()
        if cue is None:
            self.controller.window.show_message("no more cues in this preset")
            return False
        self._origin = time.perf_counter() - at_s
        self._play(cue)
        return True

    def _on_tick(self) -> None:
        if self.timeline is None:
            return
        for cue in self.timeline.due(time.perf_counter() - self._origin):
            self._play(cue)

    def _play(self, cue: Cue) -> None:
        ctl = self.controller
        if cue.burst:
            ctl.burst(cue.burst)
        knobs = {k: v for k, v in cue.set.items() if k != "arrival_rate"}
        if knobs:
            ctl.apply_knobs(knobs)
        if "arrival_rate" in cue.set:
            ctl.set_arrival_rate(float(cue.set["arrival_rate"]))
        if cue.ask:
            ctl.ask_every_adapter(cue.ask)
        text = cue.describe()
        fixed = [k for k in knobs if ctl.engine_ready and k not in ctl.state.capabilities.reconfigurable]
        if fixed:  # an attached server keeps its own settings: the cue must not claim otherwise
            text += f" — not on {ctl.state.source_name}: {', '.join(fixed)} is the server's own setting"
        elif ctl.engine_ready and ctl.state.capabilities.client_timings:
            text += f" (on {ctl.state.source_name}: with the server's own scheduling settings)"
        self.played.append(text)
        ctl.caption.set_cue(text)
        ctl.panels.timeline.mark_config_change(f"cue: {text}")
        ctl.window.show_message(f"cue: {text}")
