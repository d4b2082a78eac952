"""The type checker in the test suite, as tests/test_docs.py runs mkdocs: mypy (pinned in the dev extra) over
engine/, app/ and widgets/ as pyproject.toml's [tool.mypy] says (the engine's torch-free contracts strictly,
the rest at a basic level, the modules of its debt list excused), and a type error fails it: the GUI's knob
values are KnobValues (engine/knobs.py), so a knob the table lacks is an error before anything runs.

A warm run takes a few seconds (its cache under ~/.cache/inferlab/mypy); a cold one about a minute and a half
of CPU time (torch and the model libraries are read as Any, which keeps it there)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferlab" / "mypy"


def _mypy(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("mypy") is None:
        if os.environ.get("CI"):
            pytest.fail("mypy is not installed: `pip install -e '.[dev]'` brings it")
        pytest.skip("needs mypy (pip install -e '.[dev]')")
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(CACHE), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_the_code_type_checks():
    run = _mypy()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Success: no issues found" in run.stdout


def test_a_knob_the_table_lacks_is_a_type_error(tmp_path):
    """The checker the suite runs fails on a type error: a misspelt knob in KnobValues, a value of the wrong
    type, and a bit count where a format's name is wanted."""
    bad = tmp_path / "bad_knobs.py"
    bad.write_text(textwrap.dedent("""
        from engine.knobs import KnobValues
        from engine.quant_formats import quant_format

        values: KnobValues = {"quant_bits": 8}
        other: KnobValues = {"max_num_seqs": "many"}
        fmt = quant_format(8)
    """))
    run = _mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert run.returncode == 1, run.stdout
    assert '"quant_bits"' in run.stdout and '"max_num_seqs"' in run.stdout and "quant_format" in run.stdout
