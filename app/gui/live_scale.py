"""A preset's live load scaled to what the engine serves now.

A preset's arrival rate is a number in requests/s that fitted a quiet 2-core machine; on a machine busy with
other work the same rate grew an endless queue (17 waiting, p50 TTFT 8.9 s, goodput 29 %) while the preset kept
up alone. So while a preset's load runs, the engine's own steps over the last WINDOW_S seconds say how
busy it is (the steps' wall time over the wall clock: the engine steps only while it has requests). Every
CHECK_S: when it is saturated (busy SATURATED of the time with requests waiting) the capacity is the
requests it finished per second of work, and the rate becomes min(the preset's, SHARE x that capacity);
when it is idle much of the time (busy under RELAXED) below the preset's rate, the rate goes back up to
what would keep it busy SHARE of the time, at most the preset's. A change smaller than MIN_CHANGE is
left alone: loaded, not melting, and back up when the machine frees (a machine that keeps up is never
slowed: a small batch finishes fewer requests per second of work than a full one). A rate the user (the
slider) or the preset's cue sets is theirs: scaling stops until the next preset. The controller owns
one; the panel feeder hands it every step's stats.
"""
from __future__ import annotations

import time
from collections import deque

from PySide6.QtCore import QObject, QTimer

WINDOW_S = 30.0
CHECK_S = 10.0
SHARE = 0.7  # of the measured capacity: arrivals below what is served, so the queue drains between bursts
MIN_CHANGE = 0.15  # relative: smaller corrections are noise, and every change restarts the Poisson phase
MIN_FINISHED = 4  # requests finished in the window before a capacity is trusted
MIN_BUSY_S = 3.0  # seconds of engine work in the window, likewise
SATURATED = 0.9  # busy share of the wall clock (with requests waiting) that says arrivals outrun the engine
RELAXED = 0.6  # busy share under which a scaled-down rate may go back up
RATE_STEP = 0.1  # the arrival-rate slider's step


class LiveScale(QObject):
    def __init__(self, controller, clock=time.perf_counter) -> None:
        super().__init__(controller)
        self._ctl, self._clock = controller, clock
        self._steps: deque[tuple[float, float, int]] = deque()  # (t_start, wall_time_s, finished)
        self._started = 0.0  # when this preset's scaling began (the window is no older)
        self._waiting = 0  # requests waiting after the latest step
        self.preset_rate: float | None = None  # None: not scaling (no preset, or the user chose a rate)
        self.last_capacity: float | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(int(CHECK_S * 1000))
        self._timer.timeout.connect(self.check)

    def start(self, preset_rate: float) -> None:
        """A preset's load: scale its rate from now on (its steps only: the window starts empty)."""
        self.preset_rate = preset_rate if preset_rate > 0 else None
        self._steps.clear()
        self._started = self._clock()
        if self.preset_rate is not None:
            self._timer.start()

    def user_set(self) -> None:
        """The user (or a cue) chose a rate: theirs until the next preset."""
        self.preset_rate = None
        self._timer.stop()

    def stop(self) -> None:
        self.user_set()

    def add_step(self, stats) -> None:
        self._steps.append((stats.t_start, stats.wall_time_s, stats.num_finished))
        self._waiting = stats.num_waiting
        horizon = stats.t_start - WINDOW_S
        while self._steps and self._steps[0][0] < horizon:
            self._steps.popleft()

    def capacity(self) -> float | None:
        """Requests finished per second of engine work over the window, or None while too few are known."""
        busy = sum(wall for _t, wall, _f in self._steps)
        finished = sum(f for _t, _w, f in self._steps)
        if finished < MIN_FINISHED or busy < MIN_BUSY_S:
            return None
        return finished / busy

    def busy_share(self) -> float | None:
        span = min(WINDOW_S, self._clock() - self._started)
        if span < MIN_BUSY_S:
            return None
        return min(1.0, sum(wall for _t, wall, _f in self._steps) / span)

    def target(self, current: float) -> float | None:
        """The rate to run now, on the slider's steps; None: leave it."""
        capacity, busy = self.capacity(), self.busy_share()
        self.last_capacity = capacity
        if self.preset_rate is None or capacity is None or busy is None:
            return None
        if busy >= SATURATED and self._waiting > 0:  # arrivals outrun the engine: what it serves, less
            rate = min(self.preset_rate, SHARE * capacity)
        elif busy < RELAXED and current < self.preset_rate:  # room again: up to SHARE busy, at most the preset's
            rate = min(self.preset_rate, current * SHARE / max(busy, 0.05))
        else:
            return None
        return max(RATE_STEP, round(rate / RATE_STEP) * RATE_STEP) if rate < self.preset_rate else self.preset_rate

    def check(self) -> None:
        if not getattr(self._ctl, "load_running", False):
            return
        current = self._ctl.state.arrival_rate
        rate = self.target(current)
        small = current > 0 and abs(rate - current) / current <= MIN_CHANGE if rate is not None else True
        if rate is None or rate == current or (small and rate != self.preset_rate):  # back to the preset's: always
            return
        self._ctl.scale_arrival_rate(rate, self._said(rate))

    def _said(self, rate: float) -> str:
        if rate >= (self.preset_rate or 0):
            return f"live load back to the preset's {rate:.1f} req/s: the engine has room again"
        if rate > self._ctl.state.arrival_rate:
            return (f"live load raised to {rate:.1f} req/s: the engine has room again (the preset asks "
                    f"{self.preset_rate:.1f})")
        return (f"live load scaled to {rate:.1f} req/s: {100 * SHARE:.0f} % of the {self.last_capacity:.2f} req/s "
                f"this engine serves now (the preset asks {self.preset_rate:.1f}; the slider takes over)")
