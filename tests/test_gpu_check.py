"""scripts/gpu_check.sh --dry-run: every step of the GPU day's one run, on the CPU, small."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_dry_run_writes_every_result_to_one_folder(tmp_path):
    """The dry run in this venv (the GUI stack installed: the screenshot step runs). The Triton path's steps
    (bench_decode, graphs_startup), slow under the interpreter, run in tests/test_gpu_image.py's dry run, in
    a venv of the GPU image's packages; here the rest, in the same order."""
    out = tmp_path / "check"
    steps = "bench_hf,cuda_tests,flex,screenshot"
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out),
                           "--work", str(tmp_path / "work"), "--budget-s", "400", "--steps", steps],
                          capture_output=True, text=True, timeout=420)
    assert sorted(p.name for p in out.iterdir()) == sorted(  # no more than the device tool brings back
        ["results.json", "environment.json", "bench_hf.json", "cuda_tests.xml", "app.png"])
    results = json.loads((out / "results.json").read_text())
    steps = {s["name"]: s for s in results["steps"]}
    assert list(steps) == ["environment", "bench_hf", "cuda_tests", "flex", "screenshot"]
    failed = {n: s["log_tail"][-600:] for n, s in steps.items() if s["rc"] != 0}
    assert not failed and proc.returncode == 0, failed
    assert results["dry_run"] and results["device"] == "cpu" and "random" in results["model_is"]
    env = json.loads((out / "environment.json").read_text())
    assert env["torch"] and "missing_packages" in env
    hf = json.loads((out / "bench_hf.json").read_text())
    assert hf["hf"]["eager_dynamic_cache"]["2_streams"]["median_tokens_per_s"] > 0
    assert (out / "app.png").stat().st_size > 10_000
    assert "flex eager" in steps["flex"]["log_tail"] and "generate 2:" in steps["flex"]["log_tail"]
    assert "skipped" in steps["cuda_tests"]["log_tail"]  # no GPU here: the cuda tests skip, they never fail


def test_results_json_is_written_after_every_step_and_a_bench_after_every_figure(tmp_path, monkeypatch):
    """A run cut short keeps what it reached: results.json exists before the first step ends, and a bench
    stopped after its first figure has that figure in its file."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_bench

    doc = gpu_bench.Results(tmp_path / "b.json", {"side": "ours"})
    doc.put("decode", "1_streams", "eager", value={"median_tokens_per_s": 5.0})
    assert json.loads((tmp_path / "b.json").read_text())["decode"]["1_streams"]["eager"]["median_tokens_per_s"] == 5.0
    import gpu_check

    seen = []
    real = gpu_check.run_step

    def step(name, *a):
        seen.append(json.loads((tmp_path / "out" / "results.json").read_text())["steps"])
        return real(name, [sys.executable, "-c", "pass"], {}, 10, tmp_path)

    monkeypatch.setattr(gpu_check, "run_step", step)
    monkeypatch.setattr(gpu_check, "pick_model", lambda *a: ("m", "as given"))
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
                           "--steps", "bench_decode,bench_hf"]) == 0
    assert [len(s) for s in seen] == [1, 2]  # the environment, then the first bench, on disk before the next


BLOCKER = """
import sys, importlib.abc
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"PySide6", "shiboken6", "pyqtgraph", "qasync", "fastapi", "starlette", "uvicorn",
                                  "gguf", "platformdirs", "pytestqt"}:
            raise ImportError("not on the GPU machine: " + name)
sys.meta_path.insert(0, Blocked())
"""


def test_the_benches_need_neither_the_gui_nor_the_http_stack():
    """The lent GPU machines lack PySide6, FastAPI, gguf, platformdirs: the bench commands and the
    engine must not import them just to start."""
    code = BLOCKER + """
from app.cli import build_parser
args = build_parser().parse_args(["bench", "decode", "--device", "cuda", "--max-tokens", "4"])
import app.bench.cli, app.bench.bandwidth, engine.llm_engine, engine.runner.graphs
print("ok", args.device, args.gpu_memory_utilization)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert proc.stdout.split() == ["ok", "cuda", "0.9"]


def test_a_step_stopped_at_its_limit_says_where_it_was(tmp_path):
    """The first GPU run's steps all stopped at their limits with nothing in their logs: now the step is
    sent SIGABRT first and Python's fault handler writes the stacks into the log."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check

    code = "import time\ndef waiting_in_this_function():\n    time.sleep(60)\nwaiting_in_this_function()\n"
    result = gpu_check.run_step("hang", [sys.executable, "-c", code], {}, 3.0, tmp_path)
    assert result.rc == 124 and result.seconds < 20
    assert "waiting_in_this_function" in result.log_tail and "stopped at its limit of 3 s" in result.log_tail


def test_on_a_gpu_compiling_is_a_step_of_its_own_after_the_eager_and_graphs_figures():
    """A bench stopped at its limit used to write nothing: on the first GPU run a compile took every step's
    time, so the GPU run measures eager and graphs first and compiles in bounded steps of their own, last."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check

    args = gpu_check.parse_args(["--device", "cuda"])
    steps = gpu_check.step_commands(args, "m", Path("/tmp/out"))
    names = [name for name, *_ in steps]
    assert names == ["bench_decode", "bench_hf", "graphs_startup", "cuda_tests", "bench_host", "bench_compile", "flex",
                     "screenshot"]
    limits = {name: limit for name, _, _, limit in steps}
    assert limits["bench_compile"] <= 60 and limits["flex"] <= 60 and limits["bench_host"] <= 60
    for name, command, _, _ in steps:
        assert ("compile" in command[command.index("--modes") + 1:command.index("--modes") + 2]
                if "--modes" in command else False) == (name == "bench_compile"), name
    dry = [name for name, *_ in gpu_check.step_commands(gpu_check.parse_args(["--dry-run", "--device", "cpu"]), "m",
                                                        Path("/tmp/out"))]
    assert "bench_compile" not in dry
    assert gpu_check.parse_args(["--limit-s", "300"]).limit_s == 300  # the budget: 40 s before the call's limit
