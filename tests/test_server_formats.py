"""Managed servers' and `inferlab tune`'s weight formats by NAME (issue 50 point 2, app/managed/formats.py): two
formats of one bit count (llama.cpp's q4_0 and q4_1, inferlab's int8 and fp8-e4m3) stay apart from the flag
to the server's command line, the sweep's JSON and the plot's label; a bit count where a name is wanted
(--bits, --weights 4=PATH, a tuning result written before formats had names) is a clear error naming the new
spelling, and a lying result loses nothing else."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from app.cli import main
from app.managed.formats import SERVER_FORMAT_BY_NAME, default_formats, for_slider, formats_for, parse_formats
from app.managed.inferlab_serve import InferlabServe
from app.managed.knobs import knob_values, point_with
from app.managed.llama_server import LlamaServer
from app.managed.setup import SetupError, gguf_dir_files, parse_weights, served_model
from app.managed.table import FlagError, ServedModel, ServerPoint
from engine.quant_formats import QUANT_FORMAT_NAMES

Q4S = ServedModel(by_format={"bf16": "m.bf16.gguf", "q4_0": "m.q4_0.gguf", "q4_1": "m.q4_1.gguf"}, name="m")


def test_two_4_bit_gguf_formats_run_two_different_files_with_two_labels():
    table = LlamaServer()
    q4_0, q4_1 = ServerPoint(weight_format="q4_0"), ServerPoint(weight_format="q4_1")
    assert table.point_flags(Q4S, q4_0)[:2] == ["-m", "m.q4_0.gguf"]
    assert table.point_flags(Q4S, q4_1)[:2] == ["-m", "m.q4_1.gguf"]
    assert (q4_0.label(), q4_1.label()) == ("batch 8, Q4_0, no draft", "batch 8, Q4_1, no draft")


def test_int8_and_fp8_on_inferlab_serve_are_two_quant_formats():
    model = ServedModel(by_format={"bf16": "smollm2-135m"}, name="m")
    flags = {f: InferlabServe().point_flags(model, ServerPoint(weight_format=f)) for f in ("int8", "fp8-e4m3")}
    assert [f[f.index("--quant-format") + 1] for f in flags.values()] == ["int8", "fp8-e4m3"]
    assert "--quant-format" not in InferlabServe().point_flags(model, ServerPoint())  # bf16: the weights as stored
    # every engine format the app's slider names is one inferlab serve takes
    assert set(QUANT_FORMAT_NAMES) == set(formats_for("inferlab"))


def test_the_weights_slider_picks_each_engines_own_format_and_refuses_one_it_has_none_for():
    assert for_slider("llama-server", "int4").name == "q4_1"
    assert for_slider("llama-server", "int4", have=("bf16", "q4_0")).name == "q4_0"  # the file the model has
    assert for_slider("vllm", "fp8-e4m3").name == "fp8"
    with pytest.raises(ValueError, match="llama-server serves no weights for the 'fp8-e4m3' stop"):
        for_slider("llama-server", "fp8-e4m3")
    with pytest.raises(ValueError, match="vllm serves no weights for the 'int8' stop"):
        for_slider("vllm", "int8")  # the app's int8 is no fp8: no silent swap by bit count
    moved = point_with(ServerPoint(), {"quant_format": "int4"}, "llama-server", have=("bf16", "q4_0"))
    assert moved.weight_format == "q4_0" and knob_values(moved)["quant_format"] == "int4"
    with pytest.raises(ValueError, match="names a weight format, not 4"):
        point_with(ServerPoint(), {"quant_format": 4}, "llama-server")


def test_defaults_and_names_per_engine():
    assert default_formats("llama-server") == ("bf16", "q8_0", "q4_1")
    assert default_formats("vllm") == ("bf16", "fp8")  # awq/gptq need their own checkpoint
    assert parse_formats("bf16,q4_0 q4_1", "llama-server") == ("bf16", "q4_0", "q4_1")
    with pytest.raises(ValueError, match="weight format 'fp8': not one llama-server serves"):
        parse_formats("bf16,fp8", "llama-server")
    assert SERVER_FORMAT_BY_NAME["q4_0"].bits_per_weight < SERVER_FORMAT_BY_NAME["q4_1"].bits_per_weight


def test_a_bit_count_where_a_format_is_wanted_names_the_new_spelling(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--engine", "llama-server", "--bits", "16", "4", "--json", "x.json"])
    err = capsys.readouterr().err
    assert "--bits was replaced by --formats" in err and "bf16,q8_0,q4_1" in err
    with pytest.raises(SetupError, match=r"named by format now, not bits: e\.g\. q4_1=m\.gguf"):
        parse_weights(["4=m.gguf"], "llama-server")
    with pytest.raises(SetupError, match="weight format 'q4_9'"):
        parse_weights(["q4_9=m.gguf"], "llama-server")
    assert parse_weights(["q4_0=a.gguf", "q4_1=b.gguf"], "llama-server") == {"q4_0": "a.gguf", "q4_1": "b.gguf"}


def test_formats_given_on_the_command_line_reach_the_sweeps_points(tmp_path):
    from app.tradeoff.tune_cli import add_tune_args, make_spec

    folder = tmp_path / "g"
    folder.mkdir()
    for name in ("m-bf16.gguf", "m-q4_0.gguf", "m-q4_1.gguf"):
        (folder / name).write_bytes(b"GGUF")  # no header: each by its name
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    p = argparse.ArgumentParser()
    add_tune_args(p)
    args = p.parse_args(["--engine", "llama-server", "--server-bin", str(exe), "--gguf-dir", str(folder),
                         "--batch", "1", "--draft", "0", "4", "--formats", "bf16,q4_0", "q4_1", "--json", "x"])
    spec = make_spec(args, lambda line: None)
    assert sorted({p.weight_format for p in spec.points}) == ["bf16", "q4_0", "q4_1"]
    assert spec.model.draft == str(folder / "m-q4_0.gguf")  # the smallest GGUF drafts
    args.formats = ["bf16", "fp8"]
    with pytest.raises(SetupError, match="--formats: weight format 'fp8': not one llama-server serves"):
        make_spec(args, lambda line: None)


def test_a_gguf_dir_file_is_the_format_its_header_says_not_its_name(tmp_path):
    gguf = pytest.importorskip("gguf")
    named_wrong = tmp_path / "model-q8_0.gguf"  # a Q4_0 file renamed: its header is believed
    writer = gguf.GGUFWriter(str(named_wrong), "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "other-q4_1.gguf").write_bytes(b"GGUF" + bytes(60))  # says nothing readable: by its name
    assert gguf_dir_files(str(tmp_path)) == {"q4_0": str(named_wrong), "q4_1": str(tmp_path / "other-q4_1.gguf")}


def test_served_model_drafts_with_the_smallest_gguf(tmp_path, monkeypatch):
    from app.managed import gguf

    made = {"bf16": tmp_path / "m.bf16.gguf", "q8_0": tmp_path / "m.q8_0.gguf", "q4_1": tmp_path / "m.q4_1.gguf"}
    monkeypatch.setattr(gguf, "gguf_variants", lambda folder, formats, say=None: {f: made[f] for f in formats})
    monkeypatch.setattr("engine.loading.loader.resolve_model_folder", lambda model, progress: tmp_path)
    args = argparse.Namespace(model="m", gguf_dir=None, formats=["bf16", "q8_0"], draft=[0, 4], weights=[])
    model, note = served_model(args, LlamaServer(), lambda line: None)
    assert model.draft == str(made["q4_1"]) and "m.q4_1.gguf" in note  # converted for the draft


def _result(tmp_path: Path, **point) -> tuple[dict, dict]:
    p = {"label": "batch 1, Q4_0, no draft", "batch": 1, "weight_format": "q4_0", "draft": 0, **point}
    return {"engine": "llama-server", "executable": "llama-server", "threads": 1,
            "model": {"name": "m", "by_format": {"bf16": "m.bf16.gguf", "q4_0": "m.q4_0.gguf"}, "draft": None},
            "points": [p]}, p


def test_a_stored_tuning_result_starts_its_point_in_its_named_format(tmp_path):
    from app.gui.tune_actions import managed_at

    result, point = _result(tmp_path)
    stored = json.loads(json.dumps(result))  # as `inferlab tune --json` wrote it
    server = managed_at(stored, stored["points"][0], LlamaServer())
    assert server.point.weight_format == "q4_0" and server.model.weights("q4_0") == "m.q4_0.gguf"


@pytest.mark.parametrize("lie, says", [
    ({"model": {"name": "m", "by_bits": {"16": "m.gguf", "4": "m4.gguf"}}}, "by bit count"),  # before names
    ({"point": {"bits": 4}}, "by bit count"),
    ({"point": {"weight_format": "q4_9"}}, "weight format 'q4_9': not one llama-server serves"),
    ({"point": {"weight_format": 4}}, "weight format 4"),
    ({"point": {"weight_format": "fp8"}}, "not one llama-server serves"),  # vLLM's name on llama-server
    ({"model": {"name": "m", "by_format": {"x": "m.gguf"}}}, "weight format 'x'"),
    ({"model": {"name": "m", "by_format": ["m.gguf"]}}, "lists no weights per format"),
])
def test_a_lying_or_old_tuning_result_is_a_clear_error(tmp_path, lie, says):
    from app.gui.tune_actions import managed_at

    result, point = _result(tmp_path)
    point.update(lie.get("point", {}))
    result["model"] = lie.get("model", result["model"])
    with pytest.raises(ValueError, match=says):
        managed_at(result, point, LlamaServer())


def test_the_plot_labels_a_point_by_its_format_and_an_old_bits_point_by_none():
    from widgets.tradeoff_points import short_label

    assert short_label({"batch": 4, "weight_format": "q4_0", "weight_label": "Q4_0", "draft": 2}) == "b4 Q4_0 k2"
    assert short_label({"batch": 4, "weight_format": "q4_1"}) == "b4 q4_1"
    assert short_label({"batch": 4, "bits": 4}) is None  # no format guessed from a bit count


def test_an_engine_refuses_a_format_another_engine_serves():
    with pytest.raises(FlagError, match="weight format 'int8': not one llama-server serves"):
        LlamaServer().point_flags(Q4S, ServerPoint(weight_format="int8"))


def test_the_sweep_runs_bf16_first_then_by_bytes_per_weight_each_format_together():
    from app.tradeoff.tune import sweep_order

    points = tuple(ServerPoint(batch=b, weight_format=f) for f in ("q4_0", "q4_1", "bf16", "q8_0") for b in (4, 1))
    assert [(p.weight_format, p.batch) for p in sweep_order(points)] == [
        ("bf16", 1), ("bf16", 4), ("q8_0", 1), ("q8_0", 4), ("q4_1", 1), ("q4_1", 4), ("q4_0", 1), ("q4_0", 4)]
