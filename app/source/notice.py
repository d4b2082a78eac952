"""Notice: a Qt-free signal, so the engine sources (app/host, app/remote, app/managed) need no Qt.

A source emits its load notices (progress, loaded, failed) from its worker thread; the callbacks run in
that thread. The window connects them to Qt signals of an object in the GUI thread
(app/gui/source_signals.py), so its slots run there, queued, as they did when the sources were QObjects.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any


class Notice:
    """connect(callback) from any thread; emit(*args) calls every callback in the emitting thread, in the
    order connected. A callback that raises goes to sys.excepthook and the others still run, as Qt does with
    a slot: the emitting worker (a model load, a scrape) is not ended by a listener's bug."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[..., Any]] = []
        self._lock = threading.Lock()

    def connect(self, callback: Callable[..., Any]) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def disconnect(self, callback: Callable[..., Any]) -> None:
        with self._lock:
            self._callbacks.remove(callback)

    def emit(self, *args: Any) -> None:
        with self._lock:  # a copy: a callback may connect or disconnect while the others run
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(*args)
            except Exception:  # noqa: BLE001 (said, not swallowed: pytest-qt's hook fails the test)
                sys.excepthook(*sys.exc_info())
