"""Settings kept between runs (issue 12, point 9: untested before): the theme, the GPU-hour price, the
panels' layout and the last preset survive closing the window and opening a new one on the same
settings file; a window with persist=False leaves the file as it was."""
from __future__ import annotations

import pytest
from app_helpers import run_for
from PySide6.QtCore import QSettings

from app.gui.launch import _last_preset
from app.gui.main_window import MainWindow
from app.host.engine_host import EngineHost
from app.talk.presets import PRESETS_DIR, available
from engine.config import EngineConfig


def window_on(settings_file, tiny_llama, persist: bool = True) -> MainWindow:
    settings = QSettings(str(settings_file), QSettings.Format.IniFormat)
    host = EngineHost(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, num_threads=1))  # never started
    window = MainWindow(host, settings, persist=persist)
    window.controller.interactive = False
    window.show()
    return window


def test_settings_survive_a_restart(qapp, tiny_llama, tmp_path):
    ini = tmp_path / "settings.ini"
    preset = available(PRESETS_DIR)[0]
    first = window_on(ini, tiny_llama)
    first.set_theme("light")
    first.panels.tradeoff.set_price_per_hour(3.75)
    assert first.controller.apply_preset(preset)
    assert first.docks["latency"].isVisible()
    first.docks["latency"].setVisible(False)  # the layout: a closed panel stays closed
    run_for(qapp, 0.05)
    first.close()
    run_for(qapp, 0.05)

    second = window_on(ini, tiny_llama)
    try:
        assert second.theme == "light"
        assert second.panels.tradeoff.price_per_hour() == 3.75
        assert _last_preset(second.settings) == str(PRESETS_DIR / f"{preset}.toml")
        assert not second.docks["latency"].isVisible() and second.docks["timeline"].isVisible()
    finally:
        second.close()
        run_for(qapp, 0.05)


def test_a_window_that_does_not_persist_leaves_the_file_alone(qapp, tiny_llama, tmp_path):
    ini = tmp_path / "settings.ini"
    QSettings(str(ini), QSettings.Format.IniFormat).setValue("theme", "dark")
    window = window_on(ini, tiny_llama, persist=False)
    window.set_theme("light")
    window.close()
    run_for(qapp, 0.05)
    assert QSettings(str(ini), QSettings.Format.IniFormat).value("theme") == "dark"


LIES = {  # one file each: what its values are, and what the status bar must name
    "price_per_hour=abc\ngeometry=hello\nwindowState=1, 2\ntheme=purple\nlast_preset=a, b":
        ("price_per_hour", "geometry", "windowState"),
    "price_per_hour=nan\ntheme=1, 2": ("price_per_hour",),
    "price_per_hour=-5": ("price_per_hour",),
    "price_per_hour=1, 2": ("price_per_hour",),
}


@pytest.mark.parametrize("line", list(LIES))
def test_a_settings_file_that_lies_opens_the_window_with_defaults(qapp, tiny_llama, tmp_path, line, capsys):
    """A value of the wrong kind in the settings file (edited by hand, damaged) stopped the app at launch,
    every time, with a traceback: now it is left out, named in the status bar, and the default used."""
    fresh = window_on(tmp_path / "empty.ini", tiny_llama, persist=False)
    default_price = fresh.panels.tradeoff.price_per_hour()
    fresh.close()
    ini = tmp_path / "settings.ini"
    ini.write_text(f"[General]\n{line}\n")
    window = window_on(ini, tiny_llama)
    try:
        assert window.theme == "dark" and window.panels.tradeoff.price_per_hour() == default_price
        assert _last_preset(window.settings) is None
        said = window.status_label.text()
        assert "settings: left out" in said and all(key in said for key in LIES[line])
        assert said in capsys.readouterr().err  # on the terminal too: the preset's line soon replaces it
    finally:
        window.close()
        run_for(qapp, 0.05)


@pytest.mark.slow
def test_ctrl_c_in_the_terminal_closes_the_app_as_its_window_does(tiny_llama, tmp_path):
    """SIGINT while the app runs: it was raised inside a Qt timer's Python callback, printed as a traceback
    and swallowed, and the app ran on. Now it closes the window (layout saved, engine stopped), exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"),
               INFERLAB_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "--model", str(tiny_llama), "--threads", "1"],
                            cwd=Path(__file__).parent.parent, env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    conf = tmp_path / "config" / "inferlab" / "inferlab.conf"
    deadline = time.time() + 120
    while not conf.exists() and proc.poll() is None and time.time() < deadline:  # the theme is written at start
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: closing the window" in err and "KeyboardInterrupt" not in err
    assert "geometry" in conf.read_text()  # closed as the window's X closes it: the layout saved
