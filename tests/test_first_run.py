"""The first five minutes: a missing Qt system library is named, `generate` talks to an instruct model
through its chat template by default, `--help` lists the presets and the keys."""
from __future__ import annotations

import subprocess
import sys

from app.cli import build_parser
from app.generate import chat_prompt
from app.gui import qt_check
from app.gui.keys import KEYS
from app.talk.presets import available

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /x/libQt6XcbQpa.so.6 (0x7f)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb-cursor.so.0 => not found
\tlibxcb.so.1 => /lib/libxcb.so.1 (0x7f)
"""


def test_missing_libraries_named_with_their_packages(monkeypatch, tmp_path):
    assert qt_check.missing_libraries(LDD) == ["libxcb-cursor.so.0", "libxcb-icccm.so.4"]
    assert qt_check.package_for("libxcb-cursor.so.0") == "libxcb-cursor0"
    assert qt_check.package_for("libxcb.so.1") == "libxcb1"
    assert qt_check.package_for("libxcb-render-util.so.0") == "libxcb-render-util0"
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    monkeypatch.setattr(qt_check, "xcb_plugin", lambda: plugin)
    monkeypatch.setattr(qt_check.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=LDD, stderr=""))
    monkeypatch.setattr(qt_check.sys, "platform", "linux")
    problem = qt_check.platform_problem({"DISPLAY": ":0"})
    assert "libxcb-cursor.so.0, libxcb-icccm.so.4" in problem
    assert "apt-get install -y libxcb-cursor0 libxcb-icccm4" in problem
    assert qt_check.platform_problem({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}) is None
    assert "DISPLAY is not set" in qt_check.platform_problem({})


def test_gui_reports_the_problem_instead_of_aborting(monkeypatch, capsys):
    import app.gui.launch

    monkeypatch.setattr(qt_check, "platform_problem", lambda: "Qt needs libxcb-cursor.so.0")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    args = build_parser().parse_args([])
    assert app.gui.launch.run_gui(args) == 2
    assert "inferlab: error: Qt needs libxcb-cursor.so.0" in capsys.readouterr().err


class _Tok:
    def __init__(self, template: bool) -> None:
        self.has_chat_template = template

    def apply_chat_template(self, messages):
        return f"<user>{messages[0]['content']}</user><assistant>"


def test_chat_template_by_default_raw_opts_out():
    assert chat_prompt(_Tok(True), "Hello", raw=False, chat=False) == "<user>Hello</user><assistant>"
    assert chat_prompt(_Tok(True), "Hello", raw=True, chat=False) == "Hello"
    assert chat_prompt(_Tok(False), "Hello", raw=False, chat=False) == "Hello"
    try:
        chat_prompt(_Tok(False), "Hello", raw=False, chat=True)
    except ValueError as exc:
        assert "no chat template" in str(exc)
    else:
        raise AssertionError("--chat on a model without a template must fail clearly")


def test_help_lists_presets_and_keys():
    out = subprocess.run([sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name in available():
        assert name in out
    for key, _text in KEYS:
        assert key in out
