"""How many CPU threads the engine runs: the cores this process may use that are free now, followed while
it runs.

A decode step splits every stage over its threads with a barrier between stages, so one thread that
waits for a core (taken by a screen recorder, the slides, another engine) stalls all the others: on a
2-core machine with one other busy process, 2-thread decode collapsed for llama.cpp and for us alike
(issue 24). So when no count is given the engine takes the allowed cores (os.sched_getaffinity) less
those other processes keep busy, at least one, at most the physical cores (SMT siblings share one core's
vector units: torch's own default).

"Busy" is measured, not guessed from the 1-minute load average (which lags by a minute and counts our
own start-up: issue 47 found the engine on 1 thread of an idle 2-core machine right after another
process had run): the CPU time every allowed CPU spent busy over a short window, less this process's own
(engine/kernels/cpu_times.py). A thread of ours that is not the engine's, the app's GUI thread, counts as
another process's (`count_as_other`): the app leaves it a core only while it actually keeps one busy.

ThreadGovernor re-measures between steps, every WINDOW_S, and changes the count when another process
takes or frees a core (the same answer CONFIRM windows in a row, so a burst does not flip it); the
engine line says the count and why, live.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.kernels.cpu_times import (
    CpuTimes,
    count_as_other,
    counted_as_other,
    forget_other,
    other_busy_cores,
    read_cpu_times,
)

__all__ = ["ThreadChoice", "ThreadGovernor", "allowed_cores", "choose_threads", "count_as_other", "forget_other",
           "measure_busy", "off_main_thread", "physical_cores"]

_UNKNOWN = object()
WINDOW_S = 0.5  # how long one measurement of the other processes' CPU time lasts
CONFIRM = 2  # windows in a row that must agree before a running engine changes its count
BUSY_FROM = 0.5  # cores' worth of other processes' time that counts as one busy core


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    count: int
    reason: str
    busy: str = ""  # where other processes keep cores busy, that in a few words ("1 of 2 cores busy")

    def describe(self) -> str:
        return f"{self.count} thread{'s' if self.count != 1 else ''}: {self.reason}"

    def short(self) -> str:
        """For a status bar: "1 thread (1 of 2 cores busy)", "2 threads"."""
        return f"{self.count} thread{'s' if self.count != 1 else ''}{f' ({self.busy})' if self.busy else ''}"


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


def measure_busy(window_s: float = 0.3) -> float | None:
    """Cores' worth of CPU time other processes took over the next `window_s` seconds (blocking), None
    where the system does not say."""
    first = read_cpu_times()
    if first is None:
        return None
    time.sleep(window_s)
    second = read_cpu_times()
    return None if second is None else other_busy_cores(first, second)


def _busy_words(busy: float | None, window_s: float | None, allowed: int) -> tuple[int, str]:
    """(free cores, how that was found in words)."""
    if busy is None:
        return allowed, f"{allowed} cores allowed (others' CPU time unknown)"
    taken = min(allowed, int(busy + 1 - BUSY_FROM))  # 0.5 of a core busy counts as one taken
    over = f" over {window_s:.1f} s" if window_s else ""
    ours = ", ".join(counted_as_other().values())
    mine = f", {ours} included" if ours else ""
    return allowed - taken, f"{allowed - taken} of {allowed} cores free now (others busy {busy:.1f} cores{over}{mine})"


def choose_threads(requested: int | None, reserve: int = 0, *, allowed: int | None = None,
                   physical: int | None | object = _UNKNOWN, busy: float | None | object = _UNKNOWN,
                   window_s: float | None = None) -> ThreadChoice:
    """`requested` when given (the line still says how busy the machine is), else the free cores less
    `reserve`, at least 1. allowed / physical / busy (other processes' cores, measure_busy) are read from
    the system unless given (tests, the governor)."""
    allowed = allowed if allowed is not None else allowed_cores()
    physical = physical_cores() if physical is _UNKNOWN else physical
    if busy is _UNKNOWN:
        window_s = 0.3
        busy = measure_busy(window_s)
    usable = min(allowed, physical) if physical else allowed
    free, now = _busy_words(busy, window_s, allowed)
    taken = f"{allowed - free} of {allowed} cores busy" if free < allowed else ""
    if requested:
        over = busy is not None and requested > max(1, free)
        warn = "; more threads than free cores stall at every barrier" if over else ""
        return ThreadChoice(int(requested), f"as configured; {now}{warn}", taken if over else "")
    count = max(1, min(usable, free) - reserve)
    left = f", {reserve} left to the GUI" if reserve else ""
    return ThreadChoice(count, f"{now}{left} (--threads to set)", taken)


def _now() -> float:
    return time.monotonic()


class ThreadGovernor:
    """The engine's thread count while it runs: `poll()` between steps re-measures every `window_s` and
    returns True when the choice changed (the caller applies it in the thread that steps: torch's count
    is per OS thread). With a count requested it stays fixed; its reason still follows the machine.
    `read` and `clock` are the system's unless given (tests)."""

    def __init__(self, requested: int | None, *, allowed: int | None = None,
                 physical: int | None | object = _UNKNOWN, read: Callable[[], CpuTimes | None] | None = None,
                 clock: Callable[[], float] | None = None, window_s: float | None = None,
                 confirm: int = CONFIRM) -> None:
        self.requested = requested
        self.allowed = allowed if allowed is not None else allowed_cores()
        self.physical = physical_cores() if physical is _UNKNOWN else physical
        self._read, self._clock = read or read_cpu_times, clock or _now
        self.window_s, self.confirm = WINDOW_S if window_s is None else window_s, confirm
        self._last = self._read()
        self._last_at = self._clock()
        self._pending: tuple[int, int] | None = None  # (count, windows in a row that wanted it)
        self.measured = False  # whether a window has been measured yet (before: every usable core)
        self.changes = 0  # how many times the count changed while running
        self.choice = choose_threads(requested, allowed=self.allowed, physical=self.physical, busy=None)
        if requested is None:
            self.choice = ThreadChoice(self.choice.count, f"{self.allowed} cores allowed; measuring the "
                                                          "other processes' CPU time (--threads to set)")

    def poll(self) -> bool:
        """Re-measure when a window has passed; True when the choice (count or reason) changed."""
        now = self._clock()
        if now - self._last_at < self.window_s:
            return False
        current = self._read()
        previous, elapsed = self._last, now - self._last_at
        self._last, self._last_at = current, now
        if previous is None or current is None:
            return False
        busy = other_busy_cores(previous, current)
        new = choose_threads(self.requested, allowed=self.allowed, physical=self.physical, busy=busy,
                             window_s=elapsed)
        first = not self.measured
        self.measured = True
        if new.count == self.choice.count or first:  # the first window decides at once (start-up)
            self._pending = None
            changed = new != self.choice
            self.changes += new.count != self.choice.count
            self.choice = new
            return changed
        seen = self._pending[1] + 1 if self._pending and self._pending[0] == new.count else 1
        if seen < self.confirm:
            self._pending = (new.count, seen)
            return False
        self._pending = None
        self.changes += 1
        self.choice = new
        return True


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
