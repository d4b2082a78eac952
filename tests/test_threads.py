"""Thread counts from the cores that are free (engine/runner/threads.py), the line that says so, and
`bench decode --background-load N` (app/bench/background_load.py)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import pytest
import torch

from app.bench.background_load import background_load
from app.cli import build_parser
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kernels.cpu_times import CpuTimes, read_cpu_times
from engine.runner import threads as threads_mod
from engine.runner.threads import ThreadGovernor, choose_threads


@pytest.mark.parametrize(("allowed", "physical", "busy", "reserve", "expected"), [
    (2, 2, 0.0, 0, 2),  # an idle 2-core machine: both
    (2, 2, 1.2, 0, 1),  # one busy process: the other core
    (2, 2, 7.0, 0, 1),  # oversubscribed: never fewer than one
    (2, 2, 0.0, 1, 1),  # a reserve asked for
    (16, 8, 0.0, 0, 8),  # SMT siblings share a core's vector units: physical cores at most
    (4, None, 0.4, 0, 4),  # physical count unknown, a busy fraction below one half takes no core
    (4, 4, None, 0, 4),  # others' CPU time unknown: every allowed core
])
def test_free_cores_decide_the_count(allowed, physical, busy, reserve, expected):
    choice = choose_threads(None, reserve, allowed=allowed, physical=physical, busy=busy)
    assert choice.count == expected
    assert choice.describe().startswith(f"{expected} thread")
    assert "--threads to set" in choice.reason


@pytest.fixture(autouse=True)
def _no_thread_counted_as_another_process():
    """Each test scripts its own machine: no thread an earlier test's window registered (count_as_other)."""
    threads_mod.count_as_other(None)
    yield
    threads_mod.count_as_other(None)


def test_a_requested_count_is_kept_and_a_busy_machine_is_said():
    choice = choose_threads(4, allowed=2, physical=2, busy=1.0, window_s=0.5)
    assert choice.count == 4
    assert "1 of 2 cores free now (others busy 1.0 cores over 0.5 s)" in choice.reason
    assert "stall" in choice.reason and choice.short() == "4 threads (1 of 2 cores busy)"
    assert "stall" not in choose_threads(1, allowed=2, physical=2, busy=1.0).reason
    assert "stall" not in choose_threads(1, allowed=2, physical=2, busy=5.0).reason  # one is the least there is


class FakeMachine:
    """CPU time as the system would report it: `others` cores busy in other processes, `gui` cores in a
    thread of ours counted as another process's, on a clock the test moves."""

    def __init__(self) -> None:
        self.now, self.others, self.gui = 0.0, 0.0, 0.0
        self.busy = self.own = self.gui_seconds = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.busy += (self.others + self.gui + 0.9) * seconds  # ours: 0.9 of a core (the GUI thread included)
        self.own += (0.9 + self.gui) * seconds
        self.gui_seconds += self.gui * seconds

    def read(self) -> CpuTimes:
        return CpuTimes(self.now, self.busy, self.own, self.gui_seconds)


def _governor(machine: FakeMachine, requested: int | None = None) -> ThreadGovernor:
    return ThreadGovernor(requested, allowed=2, physical=2, read=machine.read, clock=lambda: machine.now,
                          window_s=0.5, confirm=2)


def _windows(gov: ThreadGovernor, machine: FakeMachine, n: int) -> list[int]:
    counts = []
    for _ in range(n):
        machine.advance(0.5)
        gov.poll()
        counts.append(gov.choice.count)
    return counts


def test_the_count_follows_a_process_that_takes_and_frees_a_core():
    """Fails on the old code: the count was chosen once, at start-up, from the 1-minute load average."""
    m = FakeMachine()
    gov = _governor(m)
    assert _windows(gov, m, 1) == [2]  # idle: both cores (the first window decides at once)
    m.others = 1.0  # another process starts
    assert _windows(gov, m, 2) == [2, 1]  # two windows agree, then one core is left to it
    assert "1 of 2 cores free now" in gov.choice.reason and gov.choice.short() == "1 thread (1 of 2 cores busy)"
    m.others = 0.0  # it stops
    assert _windows(gov, m, 2) == [1, 2]
    m.others = 1.0  # a burst of one window does not flip it
    assert _windows(gov, m, 1) == [2]
    m.others = 0.0
    assert _windows(gov, m, 3) == [2, 2, 2] and gov.changes == 2


def test_the_gui_thread_takes_a_core_only_while_it_is_busy():
    """Fails on the old code: the app always left one core to its GUI thread (1 of 2 cores decoding)."""
    m = FakeMachine()
    gov = _governor(m)
    m.gui = 0.1  # an idle window: repaints now and then
    assert _windows(gov, m, 2) == [2, 2]
    m.gui = 0.8  # a busy GUI (a screen being recorded, panels redrawing)
    assert _windows(gov, m, 2) == [2, 1]
    m.gui = 0.0
    assert _windows(gov, m, 2) == [1, 2]


def test_a_requested_count_stays_and_its_reason_follows_the_machine():
    m = FakeMachine()
    gov = _governor(m, requested=2)
    m.others = 1.0
    assert _windows(gov, m, 3) == [2, 2, 2]
    assert "stall" in gov.choice.reason


@pytest.fixture
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_engine_follows_a_busy_process_started_and_stopped_mid_run(tiny_llama, monkeypatch,
                                                                       restore_torch_threads):
    """A process that takes a core while the engine runs costs it a thread between two steps, and gives it
    back when it stops; the engine line says so. Fails on the old code: one count, chosen at start-up."""
    m = FakeMachine()
    monkeypatch.setattr(threads_mod, "allowed_cores", lambda: 2)
    monkeypatch.setattr(threads_mod, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads_mod, "read_cpu_times", m.read)
    monkeypatch.setattr(threads_mod, "_now", lambda: m.now)  # a window each step: the test moves the clock
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=16, block_size=4))
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=30, ignore_eos=True))
    seen = []
    for i in range(12):
        m.others = 1.0 if 3 <= i < 7 else 0.0  # started before step 3, stopped before step 7
        m.advance(0.5)
        eng.step()
        seen.append((eng.threads.count, torch.get_num_threads()))
        if i == 5:
            assert "1 of 2 cores free now" in eng.compute_line()
            assert eng.compute_line(short=True).endswith("· 1 thread (1 of 2 cores busy)")
    counts = [c for c, _ in seen]
    assert counts[:4] == [2, 2, 2, 2] and 1 in counts[4:7] and counts[-1] == 2, counts
    assert all(c == t for c, t in seen)  # the stepping thread runs the count the line says


def test_a_new_thread_count_starts_the_step_time_lines_afresh(tiny_llama, monkeypatch, restore_torch_threads):
    """The latency budgets plan with lines fitted on past steps' times; steps at another thread count would
    tilt them for ~20-40 steps (test_engine's latency-budget test failed so: its first steps ran at 2
    threads on a busy 2-core machine, the rest at 1). Fails with the lines kept across a change."""
    m = FakeMachine()
    monkeypatch.setattr(threads_mod, "allowed_cores", lambda: 2)
    monkeypatch.setattr(threads_mod, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads_mod, "read_cpu_times", m.read)
    monkeypatch.setattr(threads_mod, "_now", lambda: m.now)
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=16, block_size=4))
    eng.add_request(list(range(1, 20)), SamplingParams(max_tokens=30, ignore_eos=True))
    for _ in range(8):  # a clock that stands still: no window passes, the count stays
        eng.step()
    assert eng.threads.count == 2 and eng.scheduler.decode_time.sw > 3
    m.others = 1.0
    for _ in range(6):  # a window a step: the second in a row that sees the busy core changes the count
        m.advance(0.5)
        eng.step()
        if eng.threads.count == 1:
            break
    assert eng.threads.count == 1
    assert eng.scheduler.decode_time.sw <= 1 and eng.scheduler.step_time.sw == 0  # this step's time only


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


def _poll_until(gov: ThreadGovernor, count: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (gov.choice.count != count or not gov.measured):
        time.sleep(0.05)
        gov.poll()
    return gov.choice.count


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not os.path.exists("/proc/stat"),
                    reason="reads /proc/stat and pins a process to a CPU (Linux)")
def test_a_real_busy_process_costs_a_thread_and_gives_it_back():
    """The same against the real /proc/stat: a busy loop pinned to one of two CPUs takes a thread, and
    killing it gives the thread back. Skipped where those two CPUs are busy already (nothing to see)."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("one CPU allowed")
    read = functools.partial(read_cpu_times, frozenset(cpus))
    gov = ThreadGovernor(None, allowed=2, physical=2, read=read, window_s=0.25)
    if _poll_until(gov, 2, 2.0) != 2:
        pytest.skip(f"CPUs {cpus} are busy already: {gov.choice.reason}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {cpus[0]})
        assert _poll_until(gov, 1, 15.0) == 1, gov.choice.reason
    finally:
        busy.kill()
        busy.wait()
    assert _poll_until(gov, 2, 15.0) == 2, gov.choice.reason
