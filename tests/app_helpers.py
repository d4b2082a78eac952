"""Open the real main window on a tiny model, offscreen, for the app tests (not a test module)."""
from __future__ import annotations

import gc
import os
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QT_NO_GUI_THREADPOOL", "1")  # as app.gui.launch.prepare_qt_environment() does

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.gui.main_window import MainWindow  # noqa: E402
from app.host.engine_host import EngineHost  # noqa: E402
from engine.config import EngineConfig  # noqa: E402

NUM_KV_BLOCKS = 256


def open_window(model_path, preset: str | None = None, tradeoff_seconds: float = 0.5,
                timeout_s: float = 60.0, **config) -> MainWindow:
    """A shown MainWindow whose engine (1 thread, 256 KV blocks, `config`) has loaded; no settings are touched."""
    app = QApplication.instance()
    config = {"num_kv_blocks": NUM_KV_BLOCKS, "num_threads": 1, **config}
    host = EngineHost(EngineConfig(model=str(model_path), **config))
    window = MainWindow(host, None, persist=False, tradeoff_seconds=tradeoff_seconds)
    window.controller.interactive = False
    window.resize(1600, 1000)
    window.show()
    host.start()
    if preset is not None:
        assert window.controller.apply_preset(preset), window.controller.last_error
    wait_until(app, lambda: window.controller.engine_ready or host.load_error, timeout_s)
    assert host.load_error is None, host.load_error
    return window


def wait_until(app, predicate, timeout_s: float = 10.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition not met in time")
        run_for(app, 0.02)


def run_for(app, seconds: float) -> None:
    """Run the Qt event loop (timers fire, panels repaint) for `seconds`."""
    loop = QEventLoop()
    QTimer.singleShot(max(0, round(seconds * 1000)), loop.quit)
    loop.exec()


def close_window(window: MainWindow) -> None:
    host = window.host
    window.close()
    assert host._thread is None or not host._thread.is_alive(), "engine thread still running after close"
    window.deleteLater()
    run_for(QApplication.instance(), 0.05)
    gc.collect()  # Qt garbage dies here in the GUI thread, not in a later test's worker thread
