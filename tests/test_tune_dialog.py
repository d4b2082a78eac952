"""Issue 29 point 2: File -> Tune a server… runs a sweep of a managed server in a worker thread, with
progress and cancel; its points land on the tradeoff panel labelled with engine, model and flags, and a
chosen point shows its command line with "Copy command"."""
from __future__ import annotations

import pytest
from app_helpers import run_for, wait_until
from managed_helpers import argv_lines, standin_server, standin_tune
from PySide6.QtGui import QGuiApplication, QKeySequence
from PySide6.QtWidgets import QPushButton

from app.gui.main_window import MainWindow
from app.gui.tune_actions import parse_choice, parse_list
from app.gui.tune_dialog import TuneDialog
from app.remote.source import RemoteSource

pytestmark = pytest.mark.timeout(180)


def wait(qapp, predicate) -> None:
    wait_until(qapp, predicate, timeout_s=60.0)  # servers start in child processes: slower than a widget


@pytest.fixture
def window(qapp):
    w = MainWindow(RemoteSource("http://127.0.0.1:9"), None, persist=False)  # any source: it is never started
    w.controller.interactive = False
    w.show()
    yield w
    w.close()
    run_for(qapp, 0.05)


def open_dialog(qapp, window, tmp_path, monkeypatch, **lists) -> tuple[TuneDialog, list[str]]:
    shown: list[str] = []
    original = TuneDialog.set_progress
    monkeypatch.setattr(TuneDialog, "set_progress", lambda d, text, f: (shown.append(text), original(d, text, f)))
    window.tuning.engines = {"stand-in": standin_server(tmp_path).engine}
    window.tuning.runner = lambda c: standin_tune(tmp_path, c.batches, c.formats, c.drafts, c.rates)
    action = window.actions_by_name["tune"]
    assert action.shortcut() == QKeySequence("Ctrl+T") and action.text() == "Tune a server…"
    action.trigger()
    dialog = window.tuning.dialog
    assert dialog is not None and dialog.isVisible()
    dialog.set_values({"model": "tiny", "formats": "bf16", "drafts": "0", "rates": "2", **lists})
    return dialog, shown


def test_parse_choice_says_which_field_is_wrong():
    assert parse_list("1, 4,8 4", "batch sizes") == (1, 4, 8)
    with pytest.raises(ValueError, match="batch sizes: 'x' is not a list of whole numbers"):
        parse_choice({"engine": "e", "model": "m", "batches": "x", "formats": "bf16", "drafts": "0", "rates": "1"})
    with pytest.raises(ValueError, match="give a model"):
        parse_choice({"engine": "e", "model": "", "batches": "1", "formats": "bf16", "drafts": "0", "rates": "1"})


def test_tune_dialog_sweeps_two_points_onto_the_frontier_with_their_commands(qapp, window, tmp_path, monkeypatch):
    dialog, shown = open_dialog(qapp, window, tmp_path, monkeypatch, batches="1, 2")
    window.panels.tradeoff.set_available(False, "not exposed by the attached server")  # as attached windows do
    dialog.findChild(QPushButton, "tune-start").click()
    assert dialog.is_running()
    wait(qapp, lambda: window.tuning.result is not None)
    assert not dialog.is_running()
    assert "point 1/2 (batch 1, bf16, no draft): starting the server" in shown  # point i/N, what it does
    assert any(t.startswith("point 2/2 (batch 2, bf16, no draft): measuring") for t in shown)
    assert "2 points measured, 0 failed" in dialog.status_text()
    panel = window.panels.tradeoff
    window.flush_panels()
    snap = panel.snapshot_data()
    labels = {p["label"] for p in snap["points"] if p["source"] == "server"}
    assert panel.is_available()  # the sweep's points are shown, whatever the window's source offers
    assert labels == {"stand-in · tiny · batch 1, bf16, no draft", "stand-in · tiny · batch 2, bf16, no draft"}
    assert snap["frontier"] and set(snap["frontier"]) <= labels
    assert snap["current"] in labels and snap["command"]["shown"]  # the chosen point, with its command line
    panel.select_point("stand-in · tiny · batch 2, bf16, no draft")
    command = panel.snapshot_data()["command"]
    assert "-np 2" in command["line"] and "managed_standin.py" in command["line"]
    assert command["title"].startswith("stand-in · tiny · batch 2, bf16, no draft · flags:")
    assert "-np 2" in command["title"]
    panel.findChild(QPushButton, "copy-command").click()
    assert QGuiApplication.clipboard().text() == command["line"]
    assert window.status_label.text() == "copied: " + command["line"]
    panel.findChild(QPushButton, "run-point").click()  # the chosen point, in a window whose sliders restart it
    managed = window.attached_windows[-1]
    wait(qapp, lambda: managed.controller.engine_ready)
    assert argv_lines(managed.host.server)[-1][-4:] == ["-np", "2", "-m", "/models/tiny-F16.gguf"]
    assert managed.panels.controls.row("max_num_seqs").value() == 2
    managed.close()
    assert not managed.host.server.alive()


def test_a_sweep_can_be_cancelled_and_a_bad_list_starts_nothing(qapp, window, tmp_path, monkeypatch):
    dialog, _ = open_dialog(qapp, window, tmp_path, monkeypatch, batches="1, 2, 4, 8")
    dialog.set_values({"rates": "fast"})
    dialog.findChild(QPushButton, "tune-start").click()
    assert "not started: arrival rates" in dialog.status_text() and window.tuning.worker is None
    dialog.set_values({"rates": "2"})
    dialog.findChild(QPushButton, "tune-start").click()
    wait(qapp, lambda: window.panels.tradeoff.snapshot_data()["num_points"] >= 1)
    dialog.findChild(QPushButton, "tune-cancel").click()
    wait(qapp, lambda: window.tuning.result is not None)
    assert window.tuning.result["stopped_early"] == "cancelled" and len(window.tuning.result["points"]) < 4
    assert "stopped early: cancelled" in dialog.status_text()
