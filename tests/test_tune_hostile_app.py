"""File -> Tune a server… against a server that streams for ever: cancelling from the dialog, or closing
the window, stops the point under way at once (no server left running), and the GUI thread never waits."""
from __future__ import annotations

import sys
import time

import pytest
from app_helpers import run_for, wait_until
from PySide6.QtCore import QElapsedTimer, QTimer
from PySide6.QtWidgets import QPushButton
from test_managed_hostile import MODEL, HostileEngine, gone, pids

from app.gui.main_window import MainWindow
from app.managed.table import ServerPoint
from app.remote.source import RemoteSource
from app.tradeoff.tune import TuneSpec, run_tune
from app.tradeoff.tune_measure import TuneLoad

pytestmark = pytest.mark.timeout(120)
LOAD = TuneLoad(num_requests=2, rates=(100.0,), chat_max_tokens=(6, 8), long_max_tokens=(6, 8), quality_prompts=1,
                quality_tokens=4)


def start_forever_sweep(qapp, tmp_path) -> MainWindow:
    window = MainWindow(RemoteSource("http://127.0.0.1:9"), None, persist=False)  # never started
    window.controller.interactive = False
    window.show()
    engine = HostileEngine({1: ("stream-forever",), 2: ()}, record=str(tmp_path / "pids.txt"))
    spec = TuneSpec(engine=engine, exe=sys.executable, model=MODEL, load=LOAD, start_timeout_s=30.0,
                    points=(ServerPoint(batch=1), ServerPoint(batch=2)))
    window.tuning.engines = {"hostile": engine}
    window.tuning.runner = lambda choice: (lambda progress, on_point, cancelled:
                                           run_tune(spec, progress, on_point, cancelled))
    window.tuning.open()
    window.tuning.dialog.set_values({"model": "m", "batches": "1, 2", "formats": "bf16", "drafts": "0", "rates": "2"})
    window.tuning.dialog.findChild(QPushButton, "tune-start").click()
    wait_until(qapp, lambda: "measuring" in window.status_label.text(), timeout_s=60.0)  # point 1 streams
    return window


class _Ticks(list):
    """Tick times (ms) with the clock they were read from."""


def ticking(qapp):
    """A 20 ms timer on the GUI thread; ticks holds its times from 0, and longest_wait(ticks) the longest
    time between two ticks up to now (also when the work ended before a second tick)."""
    ticks = _Ticks([0])
    clock = QElapsedTimer()
    clock.start()
    ticks.clock = clock
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: ticks.append(clock.elapsed()))
    timer.start()
    return timer, ticks


def longest_wait(ticks) -> int:
    times = [*ticks, ticks.clock.elapsed()]
    return max(b - a for a, b in zip(times, times[1:]))


def test_cancel_from_the_dialog_stops_the_point_under_way(qapp, tmp_path):
    window = start_forever_sweep(qapp, tmp_path)
    timer, ticks = ticking(qapp)
    try:
        t0 = time.monotonic()
        window.tuning.dialog.findChild(QPushButton, "tune-cancel").click()
        wait_until(qapp, lambda: window.tuning.result is not None, timeout_s=30.0)
        assert time.monotonic() - t0 < 15.0  # not the stream's hour
        result = window.tuning.result
        assert result["stopped_early"] == "cancelled" and result["points"] == []
        assert "cancelled" in result["failed"][0]["reason"]
        assert all(gone(pid) for pid in pids(tmp_path / "pids.txt"))
        assert longest_wait(ticks) < 1000  # the GUI thread never waited
    finally:
        timer.stop()
        window.close()
        run_for(qapp, 0.05)


def test_closing_the_window_mid_point_leaves_no_server_running(qapp, tmp_path):
    window = start_forever_sweep(qapp, tmp_path)
    started = pids(tmp_path / "pids.txt")
    t0 = time.monotonic()
    window.close()  # waits up to STOP_WAIT_S for the sweep, which stops its point's server at once
    run_for(qapp, 0.05)
    assert started and all(gone(pid, within_s=15.0) for pid in started)
    assert time.monotonic() - t0 < 20.0  # not the stream's hour
    window.tuning.worker.join(15.0)
    assert not window.tuning.worker.running()
