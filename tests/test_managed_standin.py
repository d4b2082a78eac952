"""ManagedServer (app/managed/server.py) running vLLM's and SGLang's flag tables against the
stand-in engine (tests/standin_server.py): start waits for /health and runs exactly the table's argv,
restart(point) replaces the process with one at the new flags, a sweep (app/tradeoff/tune.py)
records a point the engine refuses and goes on, and a refused flag, a crash at start or a
server that never gets healthy each end as PointFailed with the server's last log line and nothing left
running."""
from __future__ import annotations

import shlex
import time

import httpx
import pytest
from standin_helpers import pid_alive, standin

from app.managed.server import ManagedServer, PointFailed
from app.managed.sglang import SglangEngine
from app.managed.table import ServedModel, ServerPoint
from app.managed.vllm import VllmEngine
from app.tradeoff.tune import TuneSpec, run_tune
from app.tradeoff.tune_measure import TuneLoad

MODEL = ServedModel({"bf16": "org/m-16"}, draft="org/m-draft", name="m")
ENGINES = pytest.mark.parametrize("engine", [VllmEngine(), SglangEngine()], ids=["vllm", "sglang"])


def completion(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "a b c", "max_tokens": 3},
                      timeout=10.0)


@ENGINES
def test_start_waits_for_health_and_runs_exactly_the_tables_argv(tmp_path, engine):
    fake = standin(tmp_path, engine.name)
    point = ServerPoint(batch=4, weight_format="fp8", kv_dtype="fp8", draft=2, chunked_prefill=False,
                        prefix_caching=False)
    with ManagedServer(engine, fake.exe, MODEL, point, start_timeout_s=30) as server:
        assert httpx.get(server.url + engine.health_path).status_code == 200
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "m"  # --served-model-name
        assert completion(server.url).json()["usage"]["completion_tokens"] == 3
        port = int(server.url.rsplit(":", 1)[1])
        [start] = fake.starts()
        assert start["argv"] == server.command == engine.argv(fake.exe, MODEL, point, port)
    assert not pid_alive(start["pid"])


@ENGINES
def test_restart_stops_the_old_process_and_starts_one_with_the_new_flags(tmp_path, engine):
    fake = standin(tmp_path, engine.name)
    before, after = ServerPoint(batch=2), ServerPoint(batch=16, prefix_caching=False)
    with ManagedServer(engine, fake.exe, MODEL, before, start_timeout_s=30) as server:
        server.restart(after)
        assert server.alive() and server.point == after
        assert httpx.get(server.url + "/health").status_code == 200
        old, new = fake.starts()
        assert not pid_alive(old["pid"]) and pid_alive(new["pid"])
        port = int(server.url.rsplit(":", 1)[1])
        assert new["argv"] == server.command == engine.argv(fake.exe, MODEL, after, port)
        assert "16" in new["argv"] and "16" not in old["argv"]
    assert not pid_alive(new["pid"])


@ENGINES
def test_a_flag_the_engine_refuses_is_a_failed_point_with_its_error_line(tmp_path, engine):
    # An engine release older than the table, without the draft flag: argparse refuses it (exit 2).
    dropped = "--speculative-config" if engine.name == "vllm" else "--speculative-algorithm"
    fake = standin(tmp_path, engine.name, drop=(dropped,))
    with pytest.raises(PointFailed) as failed:
        ManagedServer(engine, fake.exe, MODEL, ServerPoint(draft=3), start_timeout_s=30).start()
    assert f"error: unrecognized arguments: {dropped}" in failed.value.log_tail
    assert "exited (2)" in str(failed.value)
    assert fake.starts() == []  # refused while parsing, before it served anything


@ENGINES
def test_a_crash_at_start_is_a_failed_point_with_the_last_log_line_and_nothing_running(tmp_path, engine):
    fake = standin(tmp_path, engine.name, mode="crash-at-start")
    server = ManagedServer(engine, fake.exe, MODEL, ServerPoint(), start_timeout_s=30)
    with pytest.raises(PointFailed) as failed:
        server.start()
    assert failed.value.log_tail.splitlines()[-1].endswith("stand-in crashed while loading "
                                                          "(STANDIN_MODE=crash-at-start)")
    [start] = fake.starts()
    assert not pid_alive(start["pid"]) and not server.alive()


def test_a_server_that_never_gets_healthy_times_out_within_the_limit_and_is_stopped(tmp_path):
    fake = standin(tmp_path, "vllm", mode="hang")
    server = ManagedServer(VllmEngine(), fake.exe, MODEL, ServerPoint(), start_timeout_s=2.0)
    began = time.monotonic()
    with pytest.raises(PointFailed, match="did not answer /health within 2 s"):
        server.start()
    assert time.monotonic() - began < 2.0 + 5.0  # the limit, plus one poll and the SIGTERM
    [start] = fake.starts()
    assert not pid_alive(start["pid"]) and not server.alive()


def test_a_server_that_dies_mid_run_is_seen_dead_with_its_last_line(tmp_path):
    fake = standin(tmp_path, "sglang", mode="crash-after:2")
    with ManagedServer(SglangEngine(), fake.exe, MODEL, ServerPoint(), start_timeout_s=30) as server:
        assert [completion(server.url).status_code for _ in range(2)] == [200, 200]
        with pytest.raises(httpx.HTTPError):
            completion(server.url)
        deadline = time.monotonic() + 10
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.alive()
        assert server.log_tail().splitlines()[-1] == "crashing after 2 requests"


def test_a_sweep_records_the_point_the_engine_refuses_and_measures_the_others(tmp_path):
    # An older vLLM without --enable-prefix-caching / --no-enable-prefix-caching: only the point that turns
    # prefix caching off uses it, so that point fails at start and the sweep goes on to the next.
    fake = standin(tmp_path, "vllm", drop=("--enable-prefix-caching",))
    points = (ServerPoint(batch=1), ServerPoint(batch=2, prefix_caching=False),
              ServerPoint(batch=4, weight_format="fp8"))
    spec = TuneSpec(engine=VllmEngine(), exe=fake.exe, model=ServedModel({"bf16": "org/m-16"}, name="m"),
                    points=points, start_timeout_s=30,
                    load=TuneLoad(num_requests=3, rates=(20.0,), chat_max_tokens=(2, 4), long_max_tokens=(2, 4),
                                  quality_prompts=2, quality_tokens=4))
    result = run_tune(spec)
    assert [p["label"] for p in result["points"]] == [points[0].label(), points[2].label()]
    [failed] = result["failed"]
    assert failed["label"] == points[1].label() and failed["stage"] == "start"
    assert "error: unrecognized arguments: --no-enable-prefix-caching" in failed["log_tail"]
    ran = [start["argv"] for start in fake.starts()]  # the refused point never got as far as recording
    assert [shlex.split(p["command"]) for p in result["points"]] == ran
    assert "--quantization" in ran[1] and all(p["errors"] == 0 for p in result["points"])
    assert result["engine_source"] == VllmEngine().source
