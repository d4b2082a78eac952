"""llama-server as the peer of `bench throughput` and `bench serve --peer` (app/bench/llama_server.py,
serve_peer.py): the child-process server, the offline throughput client and the side-by-side serving
bench, against a stand-in server (tests/fake_openai_server.py); the tests marked `llama_server` run the
real binary on a tiny slice and skip where scripts/build_llama_cpp.sh has not built it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import llama_cpp_peer
import pytest

from app.bench import llama_cpp, llama_server, serve_peer
from app.bench.llama_server import ChildServer, PeerError, free_port
from app.load.workload import BenchRequest
from engine.core.metrics import SLO

FAKE = str(Path(__file__).parent / "fake_openai_server.py")
REQUESTS = [BenchRequest(list(range(100, 100 + n)), out, "chat") for n, out in ((12, 5), (40, 3), (7, 9))]


def fake_server(log: Path, *extra: str, name: str = "fake") -> ChildServer:
    port = free_port()
    return ChildServer(name, [sys.executable, FAKE, "--port", str(port), "--log", str(log), "--name", name, *extra],
                       port)


def test_throughput_client_sends_the_token_ids_and_counts_what_came_back(tmp_path):
    log = tmp_path / "bodies.jsonl"
    with fake_server(log) as server:
        run = llama_server.server_throughput(server.url, REQUESTS)
    assert server.proc.poll() is not None  # stopped on leaving the block
    assert run["output_tokens"] == 5 + 3 + 9 and run["prompt_tokens"] == 12 + 40 + 7
    assert run["output_tokens_per_s"] == pytest.approx(run["output_tokens"] / run["seconds"])
    bodies = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda b: len(b["prompt"]))
    assert [b["prompt"] for b in bodies] == sorted((r.prompt_token_ids for r in REQUESTS), key=len)
    for b in bodies:  # a fixed amount of work, every prompt prefilled in full, one reply per request
        assert b["ignore_eos"] is True and b["cache_prompt"] is False and b["stream"] is False
        assert b["temperature"] == 0.0 and "stream_options" not in b
    assert sorted(b["max_tokens"] for b in bodies) == [3, 5, 9]


def test_a_server_that_does_less_than_asked_is_an_error_not_a_figure(tmp_path):
    with fake_server(tmp_path / "log", "--short") as server, pytest.raises(PeerError, match="did other work"):
        llama_server.server_throughput(server.url, REQUESTS)


def test_a_server_that_exits_says_why(tmp_path):
    server = ChildServer("llama-server", [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"],
                         free_port())
    with pytest.raises(PeerError, match=r"llama-server exited \(3\): no such model"):
        server.start()


def test_throughput_peer_is_skipped_where_llama_server_is_not_built(tmp_path, monkeypatch):
    import contextlib

    monkeypatch.setenv("INFERLAB_LLAMA_CPP_DIR", str(tmp_path))
    with contextlib.ExitStack() as stack:
        run, info = llama_server.throughput_peer(str(tmp_path), REQUESTS, 2, 4, stack)
    assert run is None and info["skipped"].startswith(f"no llama-server under {tmp_path}")


def test_llama_server_command_gives_every_slot_its_context_and_the_same_threads():
    server = llama_server.llama_server(Path("/x/llama-server"), Path("/m.gguf"), threads=2, parallel=4,
                                       ctx_per_slot=2048)
    cmd = server.command
    assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == "2" and cmd[cmd.index("-np") + 1] == "4"
    assert cmd[cmd.index("-c") + 1] == "8192" and "--no-kv-unified" in cmd
    assert cmd[cmd.index("--port") + 1] == str(server.port)


def test_throughput_summary_has_each_round_the_median_and_the_ratio():
    from app.bench.throughput import _throughput_peer_summary

    key = "output_tokens_per_s"
    peer_runs = [{key: 100.0, "seconds": 1.0}, {key: 80.0, "seconds": 1.2}, {key: 120.0, "seconds": 0.9}]
    ours = {"eager": {f"{key}_median": 250.0}, "compile": {f"{key}_median": 200.0}}
    out = _throughput_peer_summary({"gguf": "m.gguf"}, peer_runs, ours, key)
    assert out[f"{key}_each_round"] == [100.0, 80.0, 120.0] and out[f"{key}_median"] == 100.0
    assert out["inferlab_over_llama_cpp"] == {"eager": 2.5, "compile": 2.0} and out["gguf"] == "m.gguf"
    assert _throughput_peer_summary({"skipped": "why"}, [], ours, key) == {"skipped": "why"}


def _serve_args(tmp_path, *extra: str):
    from app.cli import build_parser

    return build_parser().parse_args(["bench", "serve", "--peer", "llama-server", "--gguf", str(tmp_path / "m.gguf"),
                                      "--rates", "20", "--num-requests", "3", "--rounds", "2", "--threads", "1",
                                      "--chat-max-tokens", "2", "4", "--long-max-tokens", "2", "3", *extra])


def test_serve_peer_takes_turns_and_compares_the_same_schedule(tmp_path, monkeypatch):
    logs = {"inferlab": tmp_path / "a.jsonl", "llama.cpp": tmp_path / "b.jsonl"}
    monkeypatch.setattr(llama_cpp, "find_binary", lambda name="llama-bench", directory=None: Path("/x/" + name))
    told = []
    monkeypatch.setattr(serve_peer, "inferlab_server",
                        lambda gguf, threads, extra, dtype, budget: told.append(budget)
                        or fake_server(logs["inferlab"], name="inferlab"))
    monkeypatch.setattr(llama_server, "llama_server",
                        lambda binary, gguf, threads, parallel, ctx, extra=(): fake_server(logs["llama.cpp"],
                                                                                           name="llama"))
    result = serve_peer.run_peer_bench(_serve_args(tmp_path))
    # round 0: inferlab first; round 1: llama.cpp first (each side sees the same drift)
    assert [(r["server"], r["round"]) for r in result["runs"]] == [
        ("inferlab", 0), ("llama.cpp", 0), ("llama.cpp", 1), ("inferlab", 1)]
    sent = {side: [json.loads(x) for x in log.read_text().splitlines()][1:] for side, log in logs.items()}  # no warm-up
    # the same schedule: each round sends both servers the same prompts (requests in flight together may reach
    # a server in either order, so each round's are compared as sets)
    per_side = {side: [{b["prompt"] for b in bodies[i * 3:(i + 1) * 3]} for i in range(2)]
                for side, bodies in sent.items()}
    assert per_side["inferlab"] == per_side["llama.cpp"] and len(sent["inferlab"]) == len(sent["llama.cpp"]) == 6
    per_round = per_side["inferlab"]
    assert not per_round[0] & per_round[1]  # fresh prompts each round: no round is served from a prefix cache
    assert {b["model"] for b in sent["llama.cpp"]} == {"llama"}  # each side asked for its own model id
    assert all(b["stream"] and b["ignore_eos"] for side in sent.values() for b in side)
    assert [row["server"] for row in result["table"]] == ["inferlab", "llama.cpp"]
    assert all(row["rounds"] == 2 and row["errors"] == 0 for row in result["table"])
    ratio = result["inferlab_over_llama_cpp"][0]
    a, b = result["table"]
    assert ratio["rate_rps"] == 20 and ratio["output_tokens_per_s"] == round(
        a["output_tokens_per_s"] / b["output_tokens_per_s"], 3)
    assert result["threads"] == {"inferlab": 1, "llama.cpp": 1} and result["workload"]["rounds"] == 2
    # inferlab serve is told the SLO the run is judged by (llama-server has no such setting), and the JSON says so
    assert told == [SLO(result["slo"]["ttft_s"], result["slo"]["tpot_s"], result["slo"]["percentile"])]
    assert result["inferlab_told_slo"] is True


def test_serve_peer_without_llama_server_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_LLAMA_CPP_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="no llama-server under .*scripts/build_llama_cpp.sh"):
        serve_peer.run_peer_bench(_serve_args(tmp_path))


@pytest.mark.llama_server
def test_mixed_requests_through_the_real_llama_server():
    binary, gguf = llama_cpp_peer.tool("llama-server"), llama_cpp_peer.bf16_gguf()
    with llama_server.llama_server(binary, gguf, threads=1, parallel=2, ctx_per_slot=256) as server:
        run = llama_server.server_throughput(server.url, REQUESTS)
    assert run["output_tokens"] == 17 and run["prompt_tokens"] == 59 and run["output_tokens_per_s"] > 0


def _fake_batched_bench(tmp_path: Path, crash_without: str | None) -> Path:
    """A stand-in llama-batched-bench: dies of SIGSEGV unless `crash_without` is among its arguments (never
    when None), then prints one jsonl row as the real one does; its arguments go to args.txt."""
    script = tmp_path / "llama-batched-bench"
    crash = (f'case " $* " in *" {crash_without} "*) ;; *) kill -SEGV $$ ;; esac\n' if crash_without else "")
    script.write_text("#!/bin/sh\n" f'echo "$*" >> "{tmp_path}/args.txt"\n' + crash +
                      'echo \'{"speed_tg": 123.5, "speed_pp": 456.0}\'\n')
    script.chmod(0o755)
    return script


def test_batched_bench_that_segfaults_with_repacking_runs_again_without_it_and_says_so(tmp_path):
    from app.bench.batch_bench import batched_bench

    out = batched_bench(_fake_batched_bench(tmp_path, "--no-repack"), tmp_path / "m.gguf", 2, 4, 16, 8)
    assert out["decode_tokens_per_s"] == 123.5 and out["prefill_tokens_per_s"] == 456.0
    assert "signal 11" in out["note"] and "--no-repack" in out["note"] and out["command"].endswith("--no-repack")
    calls = (tmp_path / "args.txt").read_text().splitlines()
    assert len(calls) == 2 and "--no-repack" not in calls[0] and "-npl 4" in calls[0]


def test_batched_bench_that_works_runs_once_with_its_defaults(tmp_path):
    from app.bench.batch_bench import batched_bench

    out = batched_bench(_fake_batched_bench(tmp_path, None), tmp_path / "m.gguf", 1, 8, 16, 8)
    assert out["decode_tokens_per_s"] == 123.5 and "note" not in out
    assert len((tmp_path / "args.txt").read_text().splitlines()) == 1


def test_batched_bench_that_always_crashes_is_a_clear_error(tmp_path):
    from app.bench.batch_bench import batched_bench

    with pytest.raises(RuntimeError, match="llama-batched-bench failed"):
        batched_bench(_fake_batched_bench(tmp_path, "--never-given"), tmp_path / "m.gguf", 1, 4, 16, 8)
