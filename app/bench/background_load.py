"""`bench decode --background-load N`: N busy processes beside the measurement, as on a talk laptop
where the screen recorder and the slides take cores too. Each is a Python busy loop (one core each
while it gets one); they start before the rounds and are stopped after, by their own process ids.
What ran and the load average before and after go into the bench JSON."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

BUSY_LOOP = "while True: pass"
SETTLE_S = 1.0  # the children are running (and the scheduler sees them) before the measurement starts


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


@contextmanager
def background_load(n: int):
    """Run `n` busy processes for the duration of the block; yields the record for the JSON (its
    "load_average_after" is filled when the block ends)."""
    if n < 0:
        raise ValueError(f"--background-load must be 0 or more, got {n}")
    record = {"processes": n, "what": f"{sys.executable} -c {BUSY_LOOP!r} per process" if n else "none",
              "load_average_before": _load()}
    children = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        if children:
            time.sleep(SETTLE_S)
            dead = [c.pid for c in children if c.poll() is not None]
            if dead:
                raise RuntimeError(f"background load processes {dead} exited at once")
        yield record
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
        record["load_average_after"] = _load()
        record["still_running_after"] = sum(c.poll() is None for c in children)
