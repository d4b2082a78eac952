"""Before a sweep: let the live engine's requests finish instead of aborting them."""
from __future__ import annotations

import time

from engine.drive import drive


def finish_live_requests(host, timeout_s: float, report) -> int:
    """Step the live engine until the requests it holds now have finished, at most `timeout_s` (the
    caller stopped the load generator, so no new load arrives). Nothing is aborted: a request still
    running at the deadline waits, paused, until the caller's measurement is done. Returns how many
    are left."""
    waiting = set(host.live_request_ids)
    deadline = time.perf_counter() + timeout_s
    said = [None]

    def left() -> int:
        return len(waiting & host.live_request_ids)

    def say() -> None:
        if left() != said[0]:  # a line when the count changes, not one per step
            report(f"waiting for {left()} live requests to finish (at most {timeout_s:.0f} s)…")
            said[0] = left()

    drive(host.engine, until=lambda: not left() or time.perf_counter() >= deadline or host.stopping, before_step=say)
    return left()

