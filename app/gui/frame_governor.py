"""FrameGovernor: keeps the GUI thread's own CPU time under a small share of the wall clock by
slowing the panels' repaint timers, and speeds them up again when there is room.

Why: the engine thread and the GUI thread share one Python interpreter. Whatever the GUI thread spends
in Python (pyqtgraph's paint code, the feeder) holds the GIL that the engine thread needs between its
kernels, so GUI time comes straight out of engine time, even with a core to spare. Measured on the
default model (`inferlab bench gui`, 2 cores, one engine thread): fixed 20 Hz repaints took ~0.16 of a
core in the GUI thread and cost ~20 % of the engine's tokens/s. The governor measures instead of
guessing (time.thread_time() of the GUI thread each second) and shows the rate it chose. The window
drains engine events at twice the repaint rate (30 Hz at most), so fewer wake-ups also mean fewer GIL
hand-overs.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer, Signal

MIN_INTERVAL_MS = 50  # 20 Hz when the GUI is cheap
MAX_INTERVAL_MS = 250  # never slower than 4 Hz: the panels must still move
TARGET_SHARE = 0.05  # of one core, for everything the GUI thread does
CHECK_MS = 1000


class FrameGovernor(QObject):
    sigRateChanged = Signal(float)  # repaints per second now

    def __init__(self, panels, parent: QObject | None = None, target_share: float = TARGET_SHARE) -> None:
        super().__init__(parent)
        self._panels = [p for p in panels if hasattr(p, "set_repaint_interval")]
        self.target_share = target_share
        self.interval_ms = MIN_INTERVAL_MS
        self.last_share: float | None = None
        self._cpu, self._wall = time.thread_time(), time.perf_counter()
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_MS)
        self._timer.timeout.connect(self._on_check)
        self._timer.start()

    @property
    def rate_hz(self) -> float:
        return 1000.0 / self.interval_ms

    def stop(self) -> None:
        self._timer.stop()

    def observe(self, share: float) -> int:
        """One measurement (GUI-thread CPU seconds per wall second) -> the new repaint interval (ms)."""
        self.last_share = share
        interval = self.interval_ms
        if share > self.target_share:  # proportional step up, at most doubling per check
            interval = min(MAX_INTERVAL_MS, round(interval * min(2.0, share / self.target_share)))
        elif share < self.target_share / 2:  # room: speed up gently
            interval = max(MIN_INTERVAL_MS, round(interval / 1.25))
        if interval != self.interval_ms:
            self.interval_ms = interval
            for i, panel in enumerate(self._panels):  # phases spread over the interval: one long paint
                panel.set_repaint_interval(interval, i * interval // len(self._panels))  # becomes several short
            self.sigRateChanged.emit(self.rate_hz)
        return interval

    def _on_check(self) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        if wall > self._wall:
            self.observe((cpu - self._cpu) / (wall - self._wall))
        self._cpu, self._wall = cpu, wall
