"""How many CPU threads the engine runs: the cores this process may use that are free now.

A decode step splits every stage over its threads with a barrier between stages, so one thread that
waits for a core (taken by a screen recorder, the slides, another engine) stalls all the others: on a
2-core machine with one other busy process, 2-thread decode collapsed for llama.cpp and for us alike
(issue 24). So when no count is given the engine takes the allowed cores (os.sched_getaffinity) less
those the 1-minute load average says are busy, at least one, at most the physical cores (SMT siblings
share one core's vector units: torch's own default). The choice is made once, at start-up, and said in
one line (the engine line, `generate --stats`, the bench JSON).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

_UNKNOWN = object()


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    count: int
    reason: str

    def describe(self) -> str:
        return f"{self.count} thread{'s' if self.count != 1 else ''}: {self.reason}"


def allowed_cores() -> int:
    """Logical CPUs this process may run on (its affinity mask; a container's cpuset included)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def physical_cores() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.cpu_count(logical=False)


def load_average() -> float | None:
    """The 1-minute load average (runnable and waiting processes, ours included), None where unknown."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def choose_threads(requested: int | None, reserve: int = 0, *, allowed: int | None = None,
                   physical: int | None | object = _UNKNOWN, load: float | None | object = _UNKNOWN) -> ThreadChoice:
    """`requested` when given (the line still says how busy the machine is), else the free cores less
    `reserve` (the app leaves one to its GUI thread), at least 1. allowed / physical / load are read from
    the system unless given (tests)."""
    allowed = allowed if allowed is not None else allowed_cores()
    physical = physical_cores() if physical is _UNKNOWN else physical
    load = load_average() if load is _UNKNOWN else load
    usable = min(allowed, physical) if physical else allowed
    busy = 0 if load is None else min(allowed, int(load + 0.5))  # load 0.6 on 2 cores: one is taken
    free = allowed - busy
    now = (f"{free} of {allowed} cores free now (load average {load:.1f})" if load is not None
           else f"{allowed} cores allowed (load average unknown)")
    if requested:
        over = load is not None and requested > max(1, free)
        warn = "; more threads than free cores stall at every barrier" if over else ""
        return ThreadChoice(int(requested), f"as configured; {now}{warn}")
    count = max(1, min(usable, free) - reserve)
    left = f", {reserve} left to the GUI" if reserve else ""
    return ThreadChoice(count, f"{now}{left} (--threads to set)")


def off_main_thread(fn, *args):
    """fn(*args) in a new thread that ends with it: its result, or its exception re-raised here.

    Build an engine that another thread will step this way (`inferlab serve`, as the app's engine loop
    does). torch's CPU ops run on OpenMP (GNU libgomp), and every thread that runs a parallel region
    keeps a team of helper threads for good. Once the main thread has one (loading the weights makes
    it), every op of another thread is slower (as we read it: libgomp then manages more threads than
    there are cores, and its helpers stop spinning between regions). Measured on 2 cores: one
    element-wise op 35 -> 87 us, the steps that carry prompt chunks (hundreds of small ops) ~1.5x slower.
    A thread that ends takes its team with it."""
    import threading

    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            out["error"] = exc

    # a daemon: Ctrl+C in the waiting caller ends the process at once, not after the load finishes
    t = threading.Thread(target=target, name="engine-build", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
