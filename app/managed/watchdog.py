"""A tuning point's watchdog: the sweep's cancel and time limits, kept while the point's own thread waits
on its server (app/tradeoff/tune.py)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.managed.server import ManagedServer

WATCH_INTERVAL_S = 0.1  # how often it looks at the clock and the cancel flag


class Watchdog:
    """Stops the point's server from a thread of its own once the sweep is cancelled or the point's time is
    up (`deadline`, a perf_counter time), so a server that streams for ever, trickles bytes or never gets
    healthy cannot hold the sweep past its limit: its requests then fail at once. `reason` says why."""

    def __init__(self, server: ManagedServer, deadline: float | None, cancelled: Callable[[], bool]) -> None:
        self.server, self.deadline, self.cancelled = server, deadline, cancelled
        self.reason: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="inferlab-tune-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(WATCH_INTERVAL_S):
            if self.cancelled():
                self.reason = "cancelled while this point ran"
            elif self.deadline is not None and time.perf_counter() >= self.deadline:
                self.reason = "stopped: the point's time (--point-timeout or the sweep's --time-limit) ran out"
            else:
                continue
            self.server.stop()
            return

    def close(self) -> None:
        self._done.set()
        self._thread.join()
