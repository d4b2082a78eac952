"""Hostile servers against `inferlab tune`'s sweep (app/tradeoff/tune.py): a /metrics that lies
(NaN, inf, 12 MiB, never ends), a /v1/models that is not JSON or lists nothing, a completion stream that
never ends, a 12 MiB greedy reply, a cancel mid-point, an interrupt mid-point. Each point is recorded
(measured or failed with a clear reason), the sweep goes on, finishes within its limits, its result is
plain JSON, and no server is left running."""
from __future__ import annotations

import json
import sys
import time

import pytest
from test_managed_hostile import HOSTILE, MODEL, HostileEngine, gone, pids

from app.managed.table import ServerPoint
from app.tradeoff.tune import TuneSpec, run_tune
from app.tradeoff.tune_measure import TuneLoad

LOAD = TuneLoad(num_requests=2, rates=(100.0,), chat_max_tokens=(6, 8), long_max_tokens=(6, 8), quality_prompts=1,
                quality_tokens=4)


def sweep(tmp_path, modes_by_batch: dict, run_kw: dict | None = None, **spec_kw) -> tuple[dict, list[int]]:
    """run_tune over one point per batch in `modes_by_batch` (that point's server runs those modes)."""
    record = tmp_path / "pids.txt"
    engine = HostileEngine(modes_by_batch, record=str(record))
    spec_kw.setdefault("start_timeout_s", 30.0)
    spec = TuneSpec(engine=engine, exe=sys.executable, model=MODEL, load=LOAD,
                    points=tuple(ServerPoint(batch=b) for b in modes_by_batch), **spec_kw)
    return run_tune(spec, **(run_kw or {})), pids(record)


def by_batch(result: dict) -> dict:
    return {p["batch"]: p for p in result["points"] + result["failed"]}


def test_lying_metrics_leave_a_plain_json_result_and_bounded_reads(tmp_path):
    t0 = time.monotonic()
    result, started = sweep(tmp_path, {1: ("metrics-nan",), 2: ("metrics-huge",), 3: ("metrics-endless",)})
    assert time.monotonic() - t0 < 60
    json.dumps(result, allow_nan=False)  # NaN/inf from the server never reach the JSON
    points = by_batch(result)
    assert [points[b]["failed"] for b in (1, 2, 3)] == [False] * 3
    nan = points[1]["memory"]["server_metrics"]
    assert nan.get("llamacpp:prompt_tokens") == 1e308 and "llamacpp:kv_cache_usage_ratio" not in nan
    assert points[1]["draft_acceptance"] is None  # inf accepted of 0 drafted is not a share
    for b in (2, 3):
        assert "unavailable" in points[b]["memory"]["server_metrics"], points[b]["memory"]
    assert all(gone(pid) for pid in started)


@pytest.mark.parametrize("mode", ["models-invalid", "models-empty", "greedy-huge"])
def test_a_malformed_answer_fails_that_point_clearly_and_the_sweep_goes_on(tmp_path, mode):
    result, started = sweep(tmp_path, {1: (), 2: (mode,), 3: ()})
    points = by_batch(result)
    assert [points[b]["failed"] for b in (1, 2, 3)] == [False, True, False]
    bad = points[2]
    assert bad["stage"] == "measure"
    assert ("/v1/models" in bad["reason"]) if mode.startswith("models") else ("KiB" in bad["reason"])
    json.dumps(result, allow_nan=False)
    assert all(gone(pid) for pid in started)


def test_a_stream_that_never_ends_is_stopped_at_the_time_limit(tmp_path):
    t0 = time.monotonic()
    result, started = sweep(tmp_path, {1: ("stream-forever",), 2: ()}, time_limit_s=4.0)
    assert time.monotonic() - t0 < 4.0 + 15.0  # the limit, then at most a stop's grace
    assert [f["batch"] for f in result["failed"]] == [1]
    assert "time" in result["failed"][0]["reason"]
    assert result["not_run"] == [ServerPoint(batch=2).label()]
    assert all(gone(pid) for pid in started)


def test_a_cancel_mid_point_stops_that_server_and_runs_no_other(tmp_path):
    measuring = []
    t0 = time.monotonic()
    result, started = sweep(tmp_path, {1: ("stream-forever",), 2: ()}, run_kw={
        "progress": lambda text, _f: measuring.append(time.monotonic()) if "measuring" in text else None,
        "cancelled": lambda: bool(measuring) and time.monotonic() > measuring[0] + 1.0})
    assert time.monotonic() - t0 < 30
    assert result["stopped_early"] == "cancelled"
    assert [f["batch"] for f in result["failed"]] == [1] and "cancelled" in result["failed"][0]["reason"]
    assert result["not_run"] == [ServerPoint(batch=2).label()]
    assert all(gone(pid) for pid in started)


def test_a_cancel_while_the_server_is_not_ready_yet_ends_the_point_at_once(tmp_path):
    # the cancel stops the server while the sweep still waits for its first completion: that wait (up to
    # start_timeout_s) ends at once instead of polling a server that is gone
    measuring = []
    t0 = time.monotonic()
    result, started = sweep(tmp_path, {1: ("refuse-completions",), 2: ()}, start_timeout_s=60.0, run_kw={
        "progress": lambda text, _f: measuring.append(time.monotonic()) if "measuring" in text else None,
        "cancelled": lambda: bool(measuring) and time.monotonic() > measuring[0] + 0.5})
    assert time.monotonic() - t0 < 30  # not the 60 s readiness wait
    assert result["stopped_early"] == "cancelled"
    assert [f["batch"] for f in result["failed"]] == [1]
    assert result["failed"][0]["reason"].startswith("cancelled while this point ran")
    assert "the server was stopped" in result["failed"][0]["reason"]
    assert all(gone(pid) for pid in started)


def test_an_interrupt_mid_point_leaves_no_server_running(tmp_path):
    def interrupt(text: str, _fraction: float) -> None:
        if "measuring" in text:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path, {1: ()}, run_kw={"progress": interrupt})
    started = pids(tmp_path / "pids.txt")
    assert started and all(gone(pid) for pid in started)


def test_a_health_that_says_200_before_the_model_is_loaded_is_waited_out(tmp_path):
    result, started = sweep(tmp_path, {1: ("ready-after:1.5",)})
    assert [p["batch"] for p in result["points"]] == [1] and result["points"][0]["errors"] == 0
    assert all(gone(pid) for pid in started)


def test_a_server_that_refuses_every_completion_is_a_failed_point_that_says_so(tmp_path):
    t0 = time.monotonic()
    result, started = sweep(tmp_path, {1: ("refuse-completions",), 2: ()}, start_timeout_s=2.0)
    assert time.monotonic() - t0 < 30
    points = by_batch(result)
    assert points[1]["failed"] and not points[2]["failed"]
    assert "no completion succeeded within 2 s" in points[1]["reason"] and "HTTP 503" in points[1]["reason"]
    assert all(gone(pid) for pid in started)


def test_inferlab_tune_killed_with_sigterm_mid_point_leaves_no_server_running(tmp_path):
    import signal
    import subprocess
    from pathlib import Path

    record = tmp_path / "pids.txt"
    wrapper = tmp_path / "vllm"  # stands where `vllm` would: the hostile server streaming for ever
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HOSTILE} --mode stream-forever --record {record} \"$@\"\n")
    wrapper.chmod(0o755)
    cli = subprocess.Popen([sys.executable, "-m", "app.cli", "tune", "--engine", "vllm", "--server-bin", str(wrapper),
                            "--model", "m", "--batch", "1", "--formats", "bf16", "--draft", "0", "--num-requests", "2",
                            "--json", str(tmp_path / "out.json")], cwd=Path(__file__).parents[1],
                           stderr=subprocess.PIPE, text=True)
    try:
        for line in cli.stderr:
            if "measuring" in line:
                break
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(30) == 128 + signal.SIGTERM
    finally:
        if cli.poll() is None:
            cli.kill()
    started = pids(record)
    assert started and all(gone(pid) for pid in started)


def test_usage_counts_over_max_tokens_are_request_errors_not_throughput(tmp_path):
    result, started = sweep(tmp_path, {1: ("usage-lies",)})
    [bad] = result["failed"]
    assert "every request" in bad["reason"] and "completion tokens for max_tokens" in bad["reason"]
    assert result["points"] == []
    assert all(gone(pid) for pid in started)


def test_a_server_with_a_huge_log_that_dies_at_start_gives_a_bounded_tail(tmp_path):
    result, _ = sweep(tmp_path, {1: ("log:16", "exit:3")})
    [bad] = result["failed"]
    assert bad["stage"] == "start" and "exited (3)" in bad["reason"]
    assert bad["log_tail"].endswith("THE LAST LINE") and len(bad["log_tail"]) < 2000
    assert len(json.dumps(result)) < 20_000  # the sweep's JSON carries tails, not logs


def test_an_output_in_no_folder_is_said_before_any_server_starts(tmp_path, capsys):
    from app.cli import main

    record = tmp_path / "pids.txt"
    wrapper = tmp_path / "vllm"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HOSTILE} --record {record} \"$@\"\n")
    wrapper.chmod(0o755)
    code = main(["tune", "--engine", "vllm", "--server-bin", str(wrapper), "--model", "m", "--batch", "1",
                 "--formats", "bf16", "--draft", "0", "--json", str(tmp_path / "out.json"),
                 "--png", str(tmp_path / "no" / "such" / "frontier.png")])
    assert code == 2 and not record.exists()
    assert f"--png {tmp_path / 'no' / 'such' / 'frontier.png'}: no such folder" in capsys.readouterr().err


def test_a_result_that_cannot_be_written_goes_to_stdout(tmp_path, capsys):
    from app.cli import main

    wrapper = tmp_path / "vllm"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HOSTILE} \"$@\"\n")
    wrapper.chmod(0o755)
    (tmp_path / "out.json").mkdir()  # a folder where the file should go: the write fails after the sweep
    code = main(["tune", "--engine", "vllm", "--server-bin", str(wrapper), "--model", "m", "--batch", "1",
                 "--formats", "bf16", "--draft", "0", "--num-requests", "2", "--quality-prompts", "1",
                 "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr()
    assert code == 1 and "the result follows on stdout" in out.err
    assert json.loads(out.out)["points"][0]["batch"] == 1
