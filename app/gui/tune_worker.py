"""TuneWorker: a tuning sweep of a managed server in a thread of its own (it starts and stops server
processes and waits for their /health: minutes the GUI thread must not spend). Its signals reach the GUI
queued; cancelling stops the point under way (the sweep's watchdog stops its server) and starts no other."""
from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

# run(progress(text, fraction), on_point(point dict), cancelled() -> bool) -> the sweep's result dict
TuneRun = Callable[[Callable[[str, float], None], Callable[[dict], None], Callable[[], bool]], dict]


class TuneWorker(QObject):
    sigProgress = Signal(str, float)  # "point i/N: what it does", fraction done
    sigPoint = Signal(object)  # one point's dict as it is measured (or failed)
    sigDone = Signal(object)  # the whole result
    sigFailed = Signal(str)  # the sweep itself could not run

    def __init__(self, run: TuneRun, parent=None) -> None:
        super().__init__(parent)
        self._run_sweep = run
        self._cancel = threading.Event()
        # not a daemon: a process that exits mid-sweep waits for the point under way, whose server the sweep
        # then stops (a daemon thread would die with the interpreter and leave that server running)
        self._thread = threading.Thread(target=self._run, name="inferlab-tune", daemon=False)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            result = self._run_sweep(self.sigProgress.emit, self.sigPoint.emit, self._cancel.is_set)
        except Exception as exc:  # noqa: BLE001 (the dialog must say it; a thread that dies silently says nothing)
            self.sigFailed.emit(f"{type(exc).__name__}: {exc}")
            return
        self.sigDone.emit(result)
