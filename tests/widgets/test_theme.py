"""Theme switching, the shared colour table, and the widgets' import boundary."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from engine.events import TokenSource
from widgets.theme import THEMES, apply_theme, is_dark, make_palette, request_color, token_color

WIDGETS_DIR = Path(__file__).resolve().parents[2] / "widgets"


@pytest.mark.parametrize("name", THEMES)
def test_apply_theme_sets_palette(qapp, name):
    apply_theme(qapp, name)
    assert is_dark(QApplication.palette()) == (name == "dark")
    apply_theme(qapp, "light")


def test_unknown_theme_is_rejected():
    with pytest.raises(ValueError):
        make_palette("sepia")


def test_token_colours_readable_in_both_themes():
    for name in THEMES:
        pal = make_palette(name)
        base = pal.color(QPalette.ColorRole.Base).lightness()
        for src in TokenSource:
            assert abs(token_color(src, pal).lightness() - base) > 60, (name, src)


def test_request_colours_stable_and_spread():
    assert request_color("req-3") == request_color("req-3")
    hues = [request_color(f"req-{i}").hueF() for i in range(8)]
    gaps = [min(abs(a - b), 1 - abs(a - b)) for i, a in enumerate(hues) for b in hues[i + 1:]]
    assert min(gaps) > 0.03
    assert request_color("x" * 5 + "9" * 400).isValid()  # long numeric suffix must not overflow


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_widgets_import_only_the_engines_torch_free_contracts():
    """engine.events (what the panels draw), engine.knobs (the table the controls are drawn from) and the
    formats it names: each torch-free by an import-linter contract."""
    for path in WIDGETS_DIR.glob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in ("torch", "transformers", "safetensors", "app"), (path.name, name)
            if top == "engine":
                assert name in ("engine.events", "engine.knobs", "engine.quant_formats"), (path.name, name)


def _torch_loaded_after(statement: str) -> bool:
    code = f"import sys; {statement}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=WIDGETS_DIR.parent, capture_output=True, text=True,
                         env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().endswith("True")


def test_importing_widgets_does_not_load_torch():
    assert not _torch_loaded_after("import engine.events")
    assert not _torch_loaded_after("import widgets")
