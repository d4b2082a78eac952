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
    assert "recordings are written and read without Qt" in proc.stdout
    assert "quant: the embedding swap never imports the weight-only layers" in proc.stdout  # the circle cut
    assert "app layers: gui above the sources and the talk" in proc.stdout  # app cut by concern, no cycles
