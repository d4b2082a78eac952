"""SourceSignals: an engine source's load notices as Qt signals of the GUI thread.

The sources are Qt-free (app/source/notice.py) and emit from their worker threads; this QObject lives in
the GUI thread, so a slot connected to its signals runs there, queued, whichever thread emitted.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal


class SourceSignals(QObject):
    sigLoadProgress = Signal(str, float)
    sigLoaded = Signal(object)  # EngineInfo
    sigLoadFailed = Signal(str)

    def __init__(self, source) -> None:
        # no Qt parent: the source's notices hold this object (bound methods), so it outlives a window closed
        # while a model still loads, and a late notice finds it whole
        super().__init__()
        source.sigLoadProgress.connect(self._progress)
        source.sigLoaded.connect(self._loaded)
        source.sigLoadFailed.connect(self._failed)

    def _progress(self, message: str, fraction: float) -> None:
        self.sigLoadProgress.emit(message, fraction)

    def _loaded(self, info) -> None:
        self.sigLoaded.emit(info)

    def _failed(self, message: str) -> None:
        self.sigLoadFailed.emit(message)
