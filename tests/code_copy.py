"""A throwaway copy of the code for tests that walk a newcomer's list of files to touch: copy engine/, app/
and widgets/, edit only the listed files there, and run a script against the copy in a fresh interpreter
(the real modules, already imported here, stay as they are)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_code(dest: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "*.so", "build")
    for package in ("engine", "app", "widgets"):
        shutil.copytree(REPO / package, dest / package, ignore=skip)
    return dest


def edit(path: Path, anchor: str, added: str) -> None:
    """Insert `added` after `anchor` (which must be in the file once: the list names the place)."""
    text = path.read_text()
    assert text.count(anchor) == 1, (path, anchor)
    path.write_text(text.replace(anchor, anchor + added))


def run_script(root: Path, script: str) -> str:
    """Run `script` with `root` first on the path; its stdout, or AssertionError with its stderr."""
    env = {"PYTHONPATH": str(root), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "QT_QPA_PLATFORM": "offscreen",
           "HOME": str(root)}
    run = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=180,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout
