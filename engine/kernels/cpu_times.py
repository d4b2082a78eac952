"""CPU time read from the system: how busy the CPUs this process may use were, how much of that was this
process's own, and how much was a thread of ours that counts as another process (the app's GUI thread).
The difference of two readings says how many cores other processes kept busy in between
(`other_busy_cores`), what engine/runner/threads.py decides the thread count by.

Linux: /proc/stat (the allowed CPUs' lines; steal time counts as busy: a core the hypervisor gave to
another machine is not ours) and /proc/self/task/TID/stat; elsewhere psutil (system-wide times).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_OTHERS: dict[int, str] = {}  # native thread id -> what it is ("the GUI"): counted as another process
_OTHERS_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class CpuTimes:
    at: float  # when it was read (time.monotonic)
    busy: float  # CPU seconds the allowed CPUs spent busy (since boot)
    own: float  # CPU seconds this process spent (every thread)
    others_own: float  # CPU seconds of this process's threads that count as other processes'


def count_as_other(native_id: int | None, what: str = "the GUI") -> None:
    """Count thread `native_id` of this process (threading.get_native_id()) as another process: the app
    registers its GUI thread, so the engine leaves it a core only while it keeps one busy. None forgets
    every registered thread (tests)."""
    with _OTHERS_LOCK:
        if native_id is None:
            _OTHERS.clear()
        else:
            _OTHERS[int(native_id)] = what


def forget_other(native_id: int) -> None:
    """Count thread `native_id` as this process's own again (the window that registered it closed)."""
    with _OTHERS_LOCK:
        _OTHERS.pop(int(native_id), None)


def counted_as_other() -> dict[int, str]:
    with _OTHERS_LOCK:
        return dict(_OTHERS)


def other_busy_cores(before: CpuTimes, after: CpuTimes) -> float:
    """Cores' worth of CPU time other processes (and our threads counted as theirs) took between two
    readings: their CPU seconds over the wall-clock seconds between them."""
    elapsed = after.at - before.at
    if elapsed <= 0:
        return 0.0
    seconds = (after.busy - before.busy) - (after.own - before.own) + (after.others_own - before.others_own)
    return max(0.0, seconds / elapsed)


def read_cpu_times(cpus: frozenset[int] | None = None) -> CpuTimes | None:
    """The current reading, None where the system does not say. `cpus`: the CPUs whose busy time counts
    (default: those this process may run on)."""
    at, own = time.monotonic(), _own_seconds()
    busy = _proc_stat_busy(cpus) if os.path.exists("/proc/stat") else _psutil_busy()
    if busy is None:
        return None
    others = sum(_thread_seconds(tid) for tid in counted_as_other())
    return CpuTimes(at, busy, own, others)


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _allowed_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _proc_stat_busy(cpus: frozenset[int] | None) -> float | None:
    """Busy CPU seconds of `cpus` (default: the allowed ones) from /proc/stat: user nice system idle iowait
    irq softirq steal (guest time is inside user)."""
    allowed = _allowed_cpus() if cpus is None else cpus
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks = 0
    found = False
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu = int(name[3:])
            fields = [int(v) for v in rest.split()[:8]]
        except ValueError:
            continue
        if (allowed is not None and cpu not in allowed) or len(fields) < 4:
            continue
        found = True
        ticks += sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
    return ticks / _TICK if found else None


def _psutil_busy() -> float | None:
    try:
        import psutil

        t = psutil.cpu_times()
    except Exception:  # noqa: BLE001 (no psutil, or a platform it cannot read: unknown)
        return None
    return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) \
        + getattr(t, "steal", 0.0)


def _thread_seconds(native_id: int) -> float:
    """CPU seconds thread `native_id` of this process has run (0 where it cannot be read: ended)."""
    path = f"/proc/self/task/{native_id}/stat"
    if os.path.exists("/proc/self/task"):
        try:
            with open(path) as f:
                fields = f.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15 of stat)
        except (OSError, ValueError, IndexError):
            return 0.0
    try:
        import psutil

        for t in psutil.Process().threads():
            if t.id == native_id:
                return t.user_time + t.system_time
    except Exception:  # noqa: BLE001 (a platform without per-thread times: the GUI counts as ours)
        pass
    return 0.0
