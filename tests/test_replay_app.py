"""A run recorded in the app (File → Record) and replayed at 4x: the panels get the live run's figures; the
replay is read-only (knobs shown as recorded, greyed), seeks, and a recording dropped on a window plays there."""
from __future__ import annotations

import threading
import time

from app_helpers import close_window, open_window, run_for, wait_until
from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.replay.source import ReplaySource

PRESET = "continuous-batching"


def _record_live(tiny_llama, path, seconds: float = 4.0):
    """A live run in the app, recorded from before its preset applies; the step stats and the latency figures
    its panels got until the recording stopped."""
    app = QApplication.instance()
    window = open_window(tiny_llama)
    assert window.recording.start(path) is None and window.recording.recorder is not None
    live = []
    window.feeder.step_listeners.append(live.append)
    assert window.controller.apply_preset(PRESET)
    window.controller.apply_knobs({"max_num_seqs": 3})  # a knob turned mid-run: recorded with its time
    t0 = time.perf_counter()
    run_for(app, seconds)
    window.flush_panels()
    latency = window.panels.latency.snapshot_data()
    window.feeder.step_listeners.remove(live.append)
    window.recording.stop()
    took = time.perf_counter() - t0
    close_window(window)
    return live, latency, took


def _replay_window(path, speed: float) -> tuple[MainWindow, ReplaySource]:
    source = ReplaySource(path, speed=speed)
    window = MainWindow(source, None, persist=False)
    window.controller.interactive = False
    window.resize(1280, 720)
    window.show()
    source.start()
    window.controller.apply_preset(PRESET)
    return window, source


def _threads_of(monkeypatch, cls, slot: str, seen: list) -> None:
    """Note the thread `cls.slot` runs in (the wrapper's name is no attribute of the receiver: PySide looks a
    slot's __name__ up on it)."""
    original = getattr(cls, slot)

    def in_which_thread(self, *args, _original=original):
        seen.append((slot, threading.current_thread()))
        return _original(self, *args)
    monkeypatch.setattr(cls, slot, in_which_thread)


def test_a_replay_at_4x_feeds_the_panels_the_live_runs_figures(qapp, tiny_llama, tmp_path, monkeypatch):
    from app.gui.recording_actions import RecordingActions
    from app.gui.replay_bar import ReplayBar

    seen: list = []  # the sources' notices come from their worker threads; these slots touch widgets
    _threads_of(monkeypatch, RecordingActions, "_on_host_loaded", seen)
    _threads_of(monkeypatch, ReplayBar, "show_state", seen)
    app = QApplication.instance()
    path = tmp_path / "live.inferlab-run"
    live, live_latency, live_s = _record_live(tiny_llama, path)
    assert len(live) > 20
    window, source = _replay_window(path, speed=4.0)
    got = []
    window.feeder.step_listeners.append(got.append)
    t0 = time.perf_counter()
    wait_until(app, lambda: source.ended, 30)
    run_for(app, 0.2)
    took = time.perf_counter() - t0
    window.flush_panels()
    assert got == live  # every step's stats, in order, as the live panels got them
    replayed = window.panels.latency.snapshot_data()
    for key in ("num_finished", "percentiles", "total_tokens_per_s", "goodput_rps", "num_within_budget"):
        assert replayed[key] == live_latency[key], key
    assert took < 0.6 * live_s, f"a 4x replay took {took:.1f} s of a {live_s:.1f} s run"
    controls = window.panels.controls
    assert not controls.row("max_num_seqs").isEnabled() and controls.config_values()["max_num_seqs"] == 3
    assert "recorded" in controls._feature_why["max_num_seqs"]
    assert [text for _t, text in source.knob_marks if "max_num_seqs" in text]
    assert window.recording.bar.isVisible() and source.recorded_on in window.recording.bar.about.text()
    close_window(window)
    slots = {slot for slot, _thread in seen}
    assert slots == {"_on_host_loaded", "show_state"}, seen  # the live host's load, the replay's, its bar
    assert all(thread is threading.main_thread() for _slot, thread in seen), seen


def test_a_replay_seeks_and_a_dropped_recording_plays_in_a_live_window(qapp, tiny_llama, tmp_path, monkeypatch):
    import app.replay.source as replay_source

    monkeypatch.setattr(replay_source, "LEAD_IN_S", 0.5)  # the plots' recent past played at once before a seek
    app = QApplication.instance()
    path = tmp_path / "live.inferlab-run"
    live, _latency, _s = _record_live(tiny_llama, path, seconds=2.5)
    window = open_window(tiny_llama, preset=PRESET)
    assert window.recording.play(path)
    source = window.recording.playing
    source.set_speed(0.0)
    controls = window.panels.controls
    wait_until(app, lambda: source.duration is not None and "recorded" in controls._feature_why.get("max_num_seqs", ""),
               20)
    assert window.controller.load_running is False and not controls.row("max_num_seqs").isEnabled()
    got = []
    window.feeder.step_listeners.append(got.append)
    source.seek(source.duration - 0.5)
    source.set_speed(4.0)
    wait_until(app, lambda: source.ended, 20)
    run_for(app, 0.2)
    assert got and got == live[-len(got):] and len(got) < len(live)  # the last second: lead-in and played
    got.clear()
    source.seek(0.0)  # back to the start after its end: the whole run again
    wait_until(app, lambda: not source.ended, 5)
    wait_until(app, lambda: source.ended, 20)
    run_for(app, 0.2)
    assert got == live
    window.recording.back_to_live()
    assert window.recording.playing is None and controls.row("max_num_seqs").isEnabled()
    close_window(window)
