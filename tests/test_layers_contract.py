"""The layering rules in pyproject.toml's import-linter contracts (docs/architecture.md explains them), enforced
by running lint-imports."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    proc = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 kept, 0 broken" in proc.stdout
    assert "quant: the embedding swap never imports the weight-only layers" in proc.stdout  # the circle cut
    assert "app layers: gui above the sources and the talk" in proc.stdout  # app cut by concern, no cycles
    assert "Qt (PySide6, pyqtgraph, qasync) and widgets only in app/gui and widgets KEPT" in proc.stdout


def test_the_sources_and_the_commands_below_the_gui_load_without_qt():
    """What the contract says statically, at run time: the engine sources, serve, tune (with its CSV) and
    prepare import no Qt, so they run where PySide6 is absent or has no display."""
    modules = ("app.host.engine_host", "app.remote.source", "app.managed.source", "app.managed.args",
               "app.tradeoff.tune_cli", "app.tradeoff.tune_export", "app.server.serve", "app.talk.compare.prepare")
    code = (f"import sys; [__import__(m) for m in {modules!r}]; "
            "qt = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'qasync', 'widgets')); "
            "print(qt); sys.exit(1 if qt else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
