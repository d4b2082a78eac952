"""Python's cyclic garbage collector runs only in the GUI thread while a window is open.

A collection runs in whichever thread happens to allocate. When the engine thread collects a cycle
that holds a Qt object (a closed dialog, an old window), the object's C++ destructor runs in the wrong
thread and can deadlock on shiboken's GIL handling. So while a window is open, automatic collection is
off and a GUI-thread timer collects instead (pyqtgraph's GarbageCollector); the engine thread never
calls gc.collect(). When the last window closes, automatic collection comes back.
"""
from __future__ import annotations

import gc

from pyqtgraph.util.garbage_collector import GarbageCollector

INTERVAL_S = 0.5

_collector: GarbageCollector | None = None
_users = 0


def acquire() -> None:
    """A window opened: collect in the GUI thread from now on (call it from the GUI thread)."""
    global _collector, _users
    _users += 1
    if _collector is None:
        _collector = GarbageCollector(interval=INTERVAL_S)


def release() -> None:
    """A window closed; the last one turns automatic collection back on."""
    global _collector, _users
    _users = max(0, _users - 1)
    if _users == 0 and _collector is not None:
        _collector.timer.stop()
        _collector = None
        gc.collect()  # what the closed window left behind goes here, in the GUI thread
        gc.enable()


def collect_and_freeze() -> None:
    """After a model (re)load: free the old engine's cycles here, then freeze what is left for good, so
    later full collections skip the model, torch and Qt (sub-millisecond instead of 100+ ms)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
