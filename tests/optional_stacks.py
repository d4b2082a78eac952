"""The suite on a machine without the GUI or HTTP stack (the lent GPU image: no PySide6, pyqtgraph,
qasync, pytest-qt, FastAPI, uvicorn, gguf, platformdirs, openai): the tests that need one of them skip,
saying which, instead of breaking the whole run at collection; the rest run.

A test module whose import fails because one of these packages is missing is reported as skipped (one
rule here rather than an importorskip line per file, so moving app/ modules touches no skip logic);
the qtbot fixture skips where pytest-qt is missing. Any other import error still fails collection.
"""
from __future__ import annotations

import importlib.util
import re

import pytest

OPTIONAL = frozenset({"PySide6", "shiboken6", "pyqtgraph", "qasync", "pytestqt", "fastapi", "starlette", "uvicorn",
                      "gguf", "platformdirs", "openai"})
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def missing_optional(error_text: str) -> str | None:
    """The optional package whose absence made a module's import fail (its last error line), else None."""
    found = _MISSING.findall(error_text)
    top = found[-1].split(".")[0] if found else None
    return top if top in OPTIONAL else None


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.failed and isinstance(collector, pytest.Module):
        package = missing_optional(str(report.longrepr))
        if package is not None:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, f"Skipped: needs {package}, which is not installed")


if importlib.util.find_spec("pytestqt") is None:
    @pytest.fixture
    def qtbot():
        pytest.skip("needs pytest-qt, which is not installed")
