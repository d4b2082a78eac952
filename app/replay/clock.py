"""The replay's clock: where in the recording (seconds) the replay is, at 1x / 2x / 4x or paused."""
from __future__ import annotations

import time

SPEEDS = (0.0, 1.0, 2.0, 4.0)  # 0: paused


class ReplayClock:
    def __init__(self, speed: float = 1.0, clock=time.perf_counter) -> None:
        self._clock = clock
        self._wall0, self._pos0, self.speed = clock(), 0.0, float(speed)

    def position(self) -> float:
        return self._pos0 + (self._clock() - self._wall0) * self.speed

    def set_speed(self, speed: float) -> None:
        self._pos0, self._wall0, self.speed = self.position(), self._clock(), float(speed)

    def jump(self, position: float) -> None:
        self._pos0, self._wall0 = float(position), self._clock()

    def wait_s(self, t: float) -> float | None:
        """Seconds of wall clock until the recording's time `t` is due (0: now); None while paused before it."""
        position = self.position()
        if t <= position:
            return 0.0
        return None if self.speed <= 0 else (t - position) / self.speed
