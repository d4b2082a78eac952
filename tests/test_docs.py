"""The user's docs: the README stays short, the docs site builds with `mkdocs build --strict` (a broken link
or anchor, or a page left out of the nav, fails it), and no README line, docs page or source file names a
repository path that does not exist (an old layout, a file only some machine has)."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
# a path under one of the repository's top folders, not the tail of another path or URL (`vllm/engine/...`)
REPO_PATH = re.compile(r"(?<![\w./~$:-])((?:engine|app|widgets|tests|scripts|presets|assets|docs|\.ci)/"
                       r"[\w./*{},-]*[\w*}])")
TOP_DOC = re.compile(r"(?<![\w./~$:-])([A-Z][A-Z_-]*\.md)\b")  # README.md, ARCHITECTURE.md: at the repository's root
SCANNED = ("README.md", "mkdocs.yml", "pyproject.toml", ".ci/run", "docs/**/*.md", "engine/**/*.py", "engine/**/*.h",
           "engine/**/*.cpp", "app/**/*.py", "widgets/**/*.py", "tests/**/*.py", "scripts/*", "presets/*.toml")
# paths inside other projects' repositories that a file names as theirs
FOREIGN = {"docs/references/production_metrics.md"}  # SGLang's metrics reference (tests/fixtures/metrics)


def _expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> `a/b.py`, `a/c.py` (one brace group)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [path[:m.start()] + part + path[m.end():] for part in m.group(1).split(",")]


def _exists(path: str) -> bool:
    """A file or folder, a glob that matches one, or a module's attribute (`engine/runner/threads.choose`)."""
    for candidate in _expand(path.rstrip(".")):
        if glob.glob(str(ROOT / candidate)):
            continue
        stem, dot, _attr = candidate.rpartition(".")
        if dot and "/" not in _attr and ((ROOT / f"{stem}.py").is_file() or (ROOT / stem).is_file()):
            continue
        return False
    return True


def _scanned_files() -> list[Path]:
    files = set()
    for pattern in SCANNED:
        files.update(p for p in ROOT.glob(pattern) if p.is_file())
    return sorted(files)


def test_every_repository_path_named_exists():
    missing = []
    for file in _scanned_files():
        if file == Path(__file__).resolve():
            continue  # its own examples of missing paths
        text = file.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for path in REPO_PATH.findall(line) + TOP_DOC.findall(line):
                if path not in FOREIGN and not _exists(path):
                    missing.append(f"{file.relative_to(ROOT)}:{number}: {path}")
    assert not missing, "paths that are not in the repository:\n" + "\n".join(missing)


def test_the_path_check_catches_a_missing_file():
    assert _exists("engine/knobs.py") and _exists("engine/kernels/core/*.h") and _exists("docs/images")
    assert _exists("engine/runner/huge_pages.ArenaPlan") and _exists("engine/{config,knobs}.py")
    assert not _exists("app/roofline_feed.py") and not _exists("engine/{config,nothing}.py")
    line = "see ARCHITECTURE.md, app/x.py, vllm/engine/arg_utils.py and tools/server/README.md"
    assert REPO_PATH.findall(line) == ["app/x.py"] and TOP_DOC.findall(line) == ["ARCHITECTURE.md"]
    assert _exists("README.md") and not _exists("ARCHITECTURE.md")


def test_readme_is_short_and_keeps_ci_test_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] in readme  # CI runs the README's test command


def test_the_app_page_lists_every_key():
    from app.gui.keys import KEYS

    app_page = (ROOT / "docs/app.md").read_text()
    assert [key for key, _ in KEYS if f"\n| {key} | " not in app_page] == []


def _require(module: str) -> None:
    """Skip where the docs tools are not installed (the lent GPU image); CI installs them (the dev extra)."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed: `pip install -e '.[dev]'` brings it (the docs extra)")
        pytest.skip(f"needs {module}, which is not installed (pip install -e '.[docs]')")


def test_docs_site_builds_strict(tmp_path):
    _require("mkdocs")
    _require("material")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's notice of its own end of life
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "architecture" / "index.html").is_file()
