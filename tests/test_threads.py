"""Thread counts from the cores that are free (engine/runner/threads.py), the line that says so, and
`bench decode --background-load N` (app/bench/background_load.py)."""
from __future__ import annotations

import pytest
import torch

from app.bench.background_load import background_load
from app.cli import build_parser
from engine import EngineConfig, LLMEngine
from engine.runner import threads as threads_mod
from engine.runner.threads import choose_threads


@pytest.mark.parametrize(("allowed", "physical", "load", "reserve", "expected"), [
    (2, 2, 0.0, 0, 2),  # an idle 2-core machine: both
    (2, 2, 1.2, 0, 1),  # one busy process: the other core
    (2, 2, 7.0, 0, 1),  # oversubscribed: never fewer than one
    (2, 2, 0.0, 1, 1),  # the app leaves one core to its GUI thread
    (16, 8, 0.0, 0, 8),  # SMT siblings share a core's vector units: physical cores at most
    (4, None, 0.4, 0, 4),  # physical count unknown, load rounds down below one half
    (4, 4, None, 0, 4),  # load average unknown (Windows): every allowed core
])
def test_free_cores_decide_the_count(allowed, physical, load, reserve, expected):
    choice = choose_threads(None, reserve, allowed=allowed, physical=physical, load=load)
    assert choice.count == expected
    assert choice.describe().startswith(f"{expected} thread")
    assert "--threads to set" in choice.reason


def test_a_requested_count_is_kept_and_a_busy_machine_is_said():
    choice = choose_threads(4, allowed=2, physical=2, load=1.0)
    assert choice.count == 4
    assert "1 of 2 cores free now (load average 1.0)" in choice.reason
    assert "stall" in choice.reason
    assert "stall" not in choose_threads(1, allowed=2, physical=2, load=1.0).reason
    assert "stall" not in choose_threads(1, allowed=2, physical=2, load=5.0).reason  # one is the least there is


@pytest.fixture
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_engine_takes_the_free_cores_and_says_so(tiny_llama, monkeypatch, restore_torch_threads):
    """Fails on the old code: with num_threads=None it kept torch's default whatever the load."""
    monkeypatch.setattr(threads_mod, "allowed_cores", lambda: 2)
    monkeypatch.setattr(threads_mod, "load_average", lambda: 1.6)  # two other busy processes
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=16, block_size=4))
    assert eng.threads.count == 1 and torch.get_num_threads() == 1
    line = eng.compute_line()
    assert "1 thread: 0 of 2 cores free now (load average 1.6)" in line
    assert eng.compute.describe() in line
    assert eng.compute_line(short=True).endswith("· 1 thread")


def test_bench_decode_takes_a_background_load():
    """Fails on the old code: `--background-load` was not an option."""
    args = build_parser().parse_args(["bench", "decode", "--background-load", "2", "--no-llama-cpp"])
    assert args.background_load == 2


def test_background_load_runs_and_stops_its_processes():
    with background_load(1) as record:
        assert record["processes"] == 1 and "while True" in record["what"]
    assert record["still_running_after"] == 0
    assert "load_average_after" in record
    with pytest.raises(ValueError, match="0 or more"):
        with background_load(-1):
            pass


def test_off_main_thread_returns_or_raises_from_a_thread_that_has_ended():
    import threading

    from engine.runner.threads import off_main_thread

    seen = []

    def work(x):
        seen.append(threading.current_thread())
        return x * 2

    assert off_main_thread(work, 21) == 42
    assert seen[0] is not threading.main_thread() and not seen[0].is_alive()  # its OpenMP team went with it

    def fail():
        raise ValueError("bad model")

    with pytest.raises(ValueError, match="bad model"):
        off_main_thread(fail)


def test_ctrl_c_while_serve_loads_is_one_line_and_exit_130(monkeypatch, capsys):
    from app.cli import build_parser
    from app.server import serve
    from engine.runner import threads

    def interrupted(fn, *args):
        raise KeyboardInterrupt  # what the waiting main thread gets from Ctrl+C

    monkeypatch.setattr(threads, "off_main_thread", interrupted)
    args = build_parser().parse_args(["serve", "--model", "nowhere.gguf"])
    assert serve.run_serve(args) == 130
    assert capsys.readouterr().err.strip() == "inferlab: interrupted while loading the model"
