"""`inferlab tune` (app/managed): the llama-server and inferlab flag tables, the sweep against the
stand-in server (tests/fake_openai_server.py run behind llama-server's own argv) with a refused flag and a
crash each recorded as a failed point while the sweep goes on, the JSON/CSV/PNG, the CLI's one-line
errors; the test marked `llama_cpp` runs a real two-point sweep and skips where llama.cpp is not built."""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import llama_cpp_peer
import pytest

from app.cli import main
from app.managed.engines import ENGINES
from app.managed.inferlab_serve import InferlabServe
from app.managed.llama_server import LlamaServer
from app.managed.table import FlagError, ServedModel, ServerPoint
from app.tradeoff.tune_measure import agreement

FAKE = str(Path(__file__).parent / "fake_openai_server.py")
GGUFS = ServedModel(by_format={"bf16": "m.bf16.gguf", "q8_0": "m.q8_0.gguf", "q4_1": "m.q4_1.gguf"},
                    draft="m.q4_1.gguf", name="m")


def test_llama_server_argv_spells_each_knob_as_its_source_does():
    table = LlamaServer(ctx_per_slot=512)
    assert table.argv("llama-server", GGUFS, ServerPoint(batch=4, weight_format="q8_0"), 9000, threads=2) == [
        "llama-server", "-m", "m.q8_0.gguf", "-np", "4", "-c", "2048", "--no-kv-unified",
        "--host", "127.0.0.1", "--port", "9000", "--metrics", "-t", "2", "-tb", "2"]
    point = ServerPoint(batch=1, weight_format="bf16", kv_dtype="q8_0", draft=3, chunked_prefill=True,
                        prefix_caching=False)
    flags = table.point_flags(GGUFS, point)
    assert flags[flags.index("-ctk") + 1] == "q8_0" and flags[flags.index("-ctv") + 1] == "q8_0"
    assert flags[flags.index("--spec-type"):] == ["--spec-type", "draft-simple", "-md", "m.q4_1.gguf",
                                                   "--spec-draft-n-max", "3", "--spec-draft-n-min", "0",
                                                   "--no-cache-prompt"]
    assert "--draft-max" not in flags  # removed in this llama.cpp (arg.cpp: "the argument has been removed")
    assert "0.3.36" in table.source and ENGINES["llama-server"].name == "llama-server"


@pytest.mark.parametrize(("point", "model", "match"), [
    (ServerPoint(kv_dtype="fp8"), GGUFS, "KV cache types are f32, f16"),
    (ServerPoint(draft=4), ServedModel(by_format={"bf16": "m.gguf"}), "needs a draft GGUF"),
    (ServerPoint(chunked_prefill=False), GGUFS, "no flag to turn chunked prefill off"),
    (ServerPoint(weight_format="q8_0"), ServedModel(by_format={"bf16": "m.gguf"}, name="m"),
     r"no q8_0 weights for m \(have: bf16\)"),
    (ServerPoint(weight_format="fp8"), GGUFS, "weight format 'fp8': not one llama-server serves"),
    (ServerPoint(batch=0), GGUFS, "-np must be at least 1"),
])
def test_llama_server_refuses_what_it_cannot_run(point, model, match):
    with pytest.raises(FlagError, match=match):
        LlamaServer().argv("llama-server", model, point, 9000)


def test_inferlab_serve_argv_quantizes_the_same_weights_and_drafts_by_ngram_without_a_draft_model():
    table = InferlabServe()
    model = ServedModel(by_format={"bf16": "smollm2-135m"}, name="smollm2-135m")
    argv = table.argv("/bin/inferlab", model, ServerPoint(batch=8, weight_format="int4", kv_dtype="int8", draft=4,
                                                          chunked_prefill=False), 9001, threads=2)
    assert argv == ["/bin/inferlab", "serve", "--model", "smollm2-135m", "--max-num-seqs", "8",
                    "--quant-format", "int4", "--kv-cache-dtype", "int8", "--spec-method", "ngram",
                    "--num-draft-tokens", "4",
                    "--no-chunked-prefill", "--host", "127.0.0.1", "--port", "9001", "--log-level", "warning",
                    "--threads", "2"]
    drafted = ServedModel(by_format={"bf16": "m"}, draft="d", name="m")
    assert table.point_flags(drafted, ServerPoint(draft=2))[-6:] == [
        "--spec-method", "draft", "--draft-model", "d", "--num-draft-tokens", "2"]
    assert table.argv(sys.executable, model, ServerPoint(), 1)[:4] == [sys.executable, "-m", "app.cli", "serve"]
    with pytest.raises(FlagError, match="no flag to turn prefix caching off"):
        table.point_flags(model, ServerPoint(prefix_caching=False))
    with pytest.raises(FlagError, match="--kv-cache-dtype takes auto, int8"):
        table.point_flags(model, ServerPoint(kv_dtype="q8_0"))


def test_agreement_is_position_by_position_and_a_short_reply_disagrees():
    ref = [(["a", "b", "c", "d"], "tokens"), (["x", "y"], "tokens")]
    cur = [(["a", "b", "z", "d"], "tokens"), (["x"], "tokens")]
    assert agreement(ref, cur) == {"agreement": 4 / 6, "agreement_positions": 6, "agreement_unit": "tokens"}


def stand_in(tmp_path: Path, *modes: str) -> Path:
    """An executable named llama-server that runs the fake OpenAI server on whatever argv it is given."""
    exe = tmp_path / "llama-server"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" --accept-any --log "{tmp_path / "bodies.jsonl"}" '
                   f'{" ".join(modes)} "$@"\n')
    exe.chmod(0o755)
    return exe


def gguf_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ggufs"
    folder.mkdir()
    for name in ("m.bf16.gguf", "m.q8_0.gguf", "m.q4_1.gguf"):
        (folder / name).write_bytes(b"GGUF")
    return folder


def test_the_sweep_goes_on_past_refused_flags_and_crashes_and_exports(tmp_path, capsys):
    exe = stand_in(tmp_path, "--refuse-flag=-ctk", "--crash-flag=-md", "--crash-after", "3")
    out = tmp_path / "tune.json"
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(exe), "--gguf-dir", str(gguf_dir(tmp_path)),
                 "--model", "m", "--batch", "1", "--formats", "bf16", "q4_1", "--draft", "0", "2", "--kv-dtype",
                 "default",
                 "q8_0", "--rates", "50", "--num-requests", "3", "--max-tokens", "2", "4", "--quality-prompts", "2",
                 "--quality-tokens", "3", "--json", str(out), "--csv", str(tmp_path / "t.csv"),
                 "--png", str(tmp_path / "t.png")]) == 0
    result = json.loads(out.read_text())
    assert [p["label"] for p in result["points"]] == ["batch 1, bf16, no draft", "batch 1, Q4_1, no draft"]
    refused = [f for f in result["failed"] if f["kv_dtype"] == "q8_0"]
    assert len(refused) == 4 and all(f["stage"] == "start" for f in refused)
    assert all("error: invalid argument: -ctk" in f["log_tail"] and "-ctk q8_0" in f["command"] for f in refused)
    crashed = [f for f in result["failed"] if f["kv_dtype"] is None]
    assert [f["draft"] for f in crashed] == [2, 2] and all(f["stage"] == "measure" for f in crashed)
    assert all("crashing after 3 requests" in f["log_tail"] for f in crashed)
    assert all(f["reason"].startswith("llama-server exited (3) during the measurement") for f in crashed)
    assert all("--spec-draft-n-max 2" in f["command"] for f in crashed)
    ref, four = result["points"]
    assert result["quality"]["reference"] == ref["label"] and ref["agreement"] == 1.0
    assert four["agreement"] == 1.0 and four["agreement_unit"] == "text characters"  # the stand-in lists no tokens
    assert ref["tokens_per_s_total"] > 0 and ref["tokens_per_s_user"] > 0 and ref["errors"] == 0
    assert ref["memory"]["rss_bytes"] > 0
    assert ref["command"].startswith(str(exe) + " -m ")
    assert ref["memory"]["server_metrics"] == {"unavailable": "HTTP 404"}
    assert result["chosen"]["command"] in {ref["command"], four["command"]}
    assert result["quality"]["perplexity_kl"].startswith("not returned by llama-server")
    assert result["model"]["draft"].endswith("m.q4_1.gguf") and "same vocabulary" in result["model"]["draft_note"]
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert len(rows) == 8 and sum(r["failed"] == "True" for r in rows) == 6
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert "point 8/8" in capsys.readouterr().err


def test_a_refused_flag_fails_that_point_at_start_with_the_servers_error(tmp_path):
    exe = stand_in(tmp_path, "--refuse-flag=-ctk")
    out = tmp_path / "tune.json"
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(exe), "--gguf-dir", str(gguf_dir(tmp_path)),
                 "--batch", "1", "--formats", "bf16", "--draft", "0", "--kv-dtype", "q8_0", "--rates", "50",
                 "--num-requests", "2", "--quality-prompts", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["points"] == [] and result["chosen"] is None
    (failed,) = result["failed"]
    assert failed["stage"] == "start" and "error: invalid argument: -ctk" in failed["log_tail"]
    assert "-ctk q8_0 -ctv q8_0" in failed["command"]


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    out = str(tmp_path / "x.json")
    assert main(["tune", "--engine", "nosuch", "--json", out]) == 2
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(tmp_path / "missing"), "--json", out]) == 2
    (tmp_path / "empty").mkdir()
    exe = stand_in(tmp_path)
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(exe), "--gguf-dir",
                 str(tmp_path / "empty"), "--json", out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"inferlab tune: unknown engine 'nosuch' (have: {', '.join(ENGINES)})",
                     f"inferlab tune: --server-bin {tmp_path / 'missing'}: not an executable file",
                     f"inferlab tune: --gguf-dir {tmp_path / 'empty'}: no .gguf files"]
    assert not os.path.exists(out)


def test_the_time_limit_leaves_the_remaining_points_not_run(tmp_path):
    out = tmp_path / "tune.json"
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(stand_in(tmp_path)), "--gguf-dir",
                 str(gguf_dir(tmp_path)), "--batch", "1", "2", "--formats", "bf16", "--draft", "0", "--time-limit", "0",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["points"] == [] and result["failed"] == []
    assert result["not_run"] == ["batch 1, bf16, no draft", "batch 2, bf16, no draft"]
    assert result["stopped_early"].startswith("time limit of 0 s reached")


def test_a_variant_without_llama_quantize_is_skipped_with_a_line(tmp_path, monkeypatch):
    from app.managed import gguf

    monkeypatch.setenv("INFERLAB_LLAMA_CPP_DIR", str(tmp_path))
    bf16 = tmp_path / "m-abc.bf16.gguf"
    bf16.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "bf16_gguf", lambda model_path, directory=None: bf16)
    said = []
    assert gguf.gguf_variants("folder", ("bf16", "q8_0", "q4_1"), say=said.append) == {"bf16": bf16}
    assert said == [f"skipping q8_0: no llama-quantize in {tmp_path / 'bin'} (scripts/build_llama_cpp.sh): no Q8_0 "
                    "GGUF", f"skipping q4_1: no llama-quantize in {tmp_path / 'bin'} (scripts/build_llama_cpp.sh): no "
                    "Q4_1 GGUF"]
    (tmp_path / "m-abc.q8_0.gguf").write_bytes(b"GGUF")  # made once: found by name, nothing is run
    assert gguf.quantized_gguf(bf16, "q8_0") == tmp_path / "m-abc.q8_0.gguf"


def test_draft_acceptance_comes_from_the_servers_own_counters():
    from app.tradeoff.tune_measure import draft_acceptance

    assert draft_acceptance({"llamacpp:spec_decode_num_accepted_tokens": 30.0,
                             "llamacpp:spec_decode_num_draft_tokens": 40.0}) == 0.75
    assert draft_acceptance({"llamacpp:spec_decode_num_draft_tokens": 0.0,
                             "llamacpp:spec_decode_num_accepted_tokens": 0.0}) is None
    assert draft_acceptance({"unavailable": "HTTP 404"}) is None


@pytest.mark.llama_cpp
def test_a_real_two_point_sweep_on_llama_server(tmp_path):
    from app.managed.gguf import quantized_gguf

    llama_cpp_peer.tool("llama-server")
    llama_cpp_peer.tool("llama-quantize")
    bf16 = llama_cpp_peer.bf16_gguf()
    folder = tmp_path / "ggufs"
    folder.mkdir()
    for path in (bf16, quantized_gguf(bf16, "q8_0")):
        (folder / path.name).symlink_to(path)
    out = tmp_path / "real.json"
    assert main(["tune", "--engine", "llama-server", "--gguf-dir", str(folder), "--batch", "2", "--formats", "bf16",
                 "q8_0",
                 "--draft", "0", "--rates", "4", "--num-requests", "2", "--max-tokens", "4", "8", "--threads", "1",
                 "--quality-prompts", "2", "--quality-tokens", "8", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())  # one run of the load per point: its tokens counted below
    assert result["failed"] == [] and [p["weight_format"] for p in result["points"]] == ["bf16", "q8_0"]
    for p in result["points"]:
        assert p["tokens_per_s_total"] > 0 and p["errors"] == 0 and p["memory"]["rss_bytes"] > 0
        assert p["agreement_unit"] == "tokens" and p["agreement_positions"] == 16
        assert p["memory"]["server_metrics"]["llamacpp:tokens_predicted"] == 2 * 8 + 16  # load + greedy
    assert result["points"][0]["agreement"] == 1.0 and 0.0 <= result["points"][1]["agreement"] <= 1.0
