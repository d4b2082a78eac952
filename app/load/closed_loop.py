"""Closed-loop users: each user asks, waits for the answer, thinks, then asks again.

Open-loop (Poisson) arrivals ignore how the server is doing. Closed-loop users slow down with it: at
most `num_users` requests are ever in flight, and the arrival rate settles at
num_users / (response time + think time). That is how interactive traffic behaves, and why a saturated
server under closed-loop load shows long latencies but no unbounded queue.

An arrival process for LoadGenerator (`next_time`, `pop`), plus `answered(now)`, which the generator
calls when one of its users' requests ends or is refused (the user then thinks and asks again).
"""
from __future__ import annotations

import heapq
import math
import random

from app.load.kinds import ArrivalKind


class ClosedLoopUsers:
    def __init__(self, rng: random.Random, num_users: int, think_time_s: float, start: float) -> None:
        self._rng = rng
        self.think_time_s = think_time_s
        # first questions spread over one think time, so the users do not all ask at once
        self._ready: list[float] = [start + self._think() for _ in range(num_users)]  # idle users' next ask
        heapq.heapify(self._ready)
        self._in_flight = 0
        self._retiring = 0  # users to drop when their answer comes (the population shrank meanwhile)

    def _think(self) -> float:
        return self._rng.expovariate(1.0 / self.think_time_s) if self.think_time_s > 0 else 0.0

    @property
    def num_users(self) -> int:
        return len(self._ready) + self._in_flight - self._retiring

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def next_time(self) -> float:
        return self._ready[0] if self._ready else math.inf

    def pop(self) -> ArrivalKind:
        heapq.heappop(self._ready)
        self._in_flight += 1
        return ArrivalKind.USER

    def answered(self, now: float) -> None:
        """A user's request ended (or was refused): it thinks, then asks again."""
        if self._in_flight == 0:
            return
        self._in_flight -= 1
        if self._retiring:
            self._retiring -= 1
            return
        heapq.heappush(self._ready, now + self._think())

    def set_users(self, n: int, now: float) -> None:
        """Grow or shrink the population: idle users leave first, busy ones after their answer."""
        change = max(0, n) - self.num_users
        while change > 0 and self._retiring:
            self._retiring -= 1
            change -= 1
        for _ in range(max(0, change)):
            heapq.heappush(self._ready, now + self._think())
        if change < 0:
            drop = min(-change, len(self._ready))
            self._ready = heapq.nsmallest(len(self._ready) - drop, self._ready)
            heapq.heapify(self._ready)
            self._retiring += -change - drop
