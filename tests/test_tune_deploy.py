"""`inferlab tune` results a user can deploy (issue 49, point 5): the PNG without a display, --weights
applied before any conversion, the path a missing llama-server was looked for in, the context each slot of
the chosen command holds (said), every point's weight format on the PNG, repeated runs with their spread, --port."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.managed.formats import SERVER_FORMAT_BY_NAME
from app.managed.llama_server import LlamaServer
from app.tradeoff.tune_measure import TuneLoad, headline
from tests.test_tune import gguf_dir, stand_in

ROOT = Path(__file__).resolve().parents[1]


def _point(label: str, batch: int, fmt: str, user: float, total: float, **extra) -> dict:
    return {"engine": "llama-server", "model": "m", "label": label, "batch": batch, "weight_format": fmt,
            "weight_label": SERVER_FORMAT_BY_NAME[fmt].label, "draft": 0,
            "kv_dtype": None, "tokens_per_s_user": user, "tokens_per_s_total": total,
            "usd_per_mtok": 2.5 / (total * 3600) * 1e6, "agreement": 1.0 if fmt == "bf16" else 0.9,
            "command": f"llama-server -np {batch}", "flags": f"-np {batch}", **extra}


RESULT = {"engine": "llama-server", "model": {"name": "m"}, "price_per_hour": 2.5,
          "points": [_point("batch 1, bf16", 1, "bf16", 40.0, 40.0), _point("batch 4, bf16", 4, "bf16", 20.0, 80.0),
                     _point("batch 1, Q4_1", 1, "q4_1", 45.0, 45.0,
                            spread={"tokens_per_s_user": [35.0, 51.0], "tokens_per_s_total": [35.0, 51.0]}),
                     _point("batch 4, Q4_0", 4, "q4_0", 12.0, 48.0)],  # the same width as Q4_1, another format
          "frontier": [{"label": "batch 1, bf16"}, {"label": "batch 4, bf16"}],
          "chosen": {"label": "batch 4, bf16", "command": "llama-server -np 4", "why": "x"}}


def test_png_without_a_display_falls_back_to_offscreen(tmp_path):
    """Without DISPLAY (and no QT_QPA_PLATFORM) Qt's default platform aborted the whole process (SIGABRT)."""
    result = tmp_path / "tune.json"
    result.write_text(json.dumps(RESULT))
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    code = ("import json, sys; from app.gui.tune_png import write_png; "
            "sys.exit(0 if write_png(json.load(open(sys.argv[1])), sys.argv[2]) else 3)")
    run = subprocess.run([sys.executable, "-c", code, str(result), str(tmp_path / "t.png")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_the_png_labels_every_weight_format_by_its_label_and_draws_the_spread(qtbot):
    from widgets.tradeoff import TradeoffPanel
    from widgets.tradeoff_points import server_label

    panel = TradeoffPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 620)
    panel.show()
    panel.set_server_sweep("llama-server", "m", RESULT["points"], [f["label"] for f in RESULT["frontier"]])
    panel.flush()
    labels = panel.snapshot_data()["labels"]
    four_bit = [server_label("llama-server", "m", p["label"]) for p in RESULT["points"] if p["weight_format"] != "bf16"]
    assert set(four_bit) <= set(labels), labels  # off the frontier, still named on the plot
    texts = {panel._labels[k].textItem.toPlainText() for k in four_bit}
    assert texts == {"b1 Q4_1", "b4 Q4_0"}  # two 4-bit formats, each by its own name
    bars = panel._spread.opts
    assert len(bars["x"]) == 1 and bars["left"][0] > 0 and bars["right"][0] > 0 and bars["top"][0] > 0
    (x0, x1), (y0, y1) = panel._plot.getPlotItem().vb.viewRange()  # the bars' ends in view, not cut at its edge
    x, y = bars["x"][0], bars["y"][0]
    assert x0 <= x - bars["left"][0] and x + bars["right"][0] <= x1
    assert y0 <= y - bars["bottom"][0] and y + bars["top"][0] <= y1


def _run(rate: float, total: float, tpot_s: float) -> dict:
    return {"rate_rps": rate, "row": {"output_tokens_per_s": total, "goodput_rps": 1.0, "slo_attainment": 1.0,
                                      "errors": 0},
            "report": {"ttft": {"p50": 0.1, "p99": 0.2}, "tpot": {"p50": tpot_s, "p99": tpot_s * 2}}}


def test_repeated_runs_give_the_median_run_and_its_spread():
    runs = [_run(2.0, 10.0, 0.1), _run(100.0, 51.0, 0.02)]
    out = headline(runs, 2.5, [_run(100.0, 35.0, 0.04), _run(100.0, 44.0, 0.025)])
    assert out["tokens_per_s_total"] == 44.0 and out["tokens_per_s_user"] == pytest.approx(40.0)  # the median run
    assert out["repeats"] == 3
    assert out["spread"]["tokens_per_s_total"] == [35.0, 51.0]
    assert out["spread"]["tokens_per_s_user"] == pytest.approx([25.0, 50.0])
    single = headline(runs, 2.5)
    assert single["tokens_per_s_total"] == 51.0 and "spread" not in single


def test_weights_overrides_apply_before_converting(monkeypatch, tmp_path):
    """`tune --weights bf16=… q8_0=… q4_1=…` converted the model first and failed ("convert_hf_to_gguf.py is
    missing")."""
    from app.managed import gguf
    from app.managed.setup import served_model

    def no_conversion(*_a, **_k):
        raise AssertionError("converted although every format was given")

    monkeypatch.setattr(gguf, "gguf_variants", no_conversion)
    files = {f: str(tmp_path / f"m.{f}.gguf") for f in ("bf16", "q8_0", "q4_1")}
    args = argparse.Namespace(model="smollm2-135m", gguf_dir=None, formats=["bf16", "q8_0", "q4_1"], draft=[0, 4],
                              weights=[f"{f}={p}" for f, p in files.items()])
    model, _note = served_model(args, LlamaServer(), lambda line: None)
    assert model.by_format == files and model.draft == files["q4_1"]
    asked = []
    monkeypatch.setattr(gguf, "gguf_variants", lambda folder, formats, say=None: asked.append(formats) or
                        {"bf16": tmp_path / "c16.gguf", "q8_0": tmp_path / "c8.gguf"})
    monkeypatch.setattr("engine.loading.loader.resolve_model_folder", lambda model, progress: tmp_path)
    args.weights = [f"q4_1={files['q4_1']}"]
    model, _ = served_model(args, LlamaServer(), lambda line: None)
    assert asked == [("bf16", "q8_0")] and model.by_format["q4_1"] == files["q4_1"]  # only what no --weights names


def test_a_missing_llama_server_names_the_folder_looked_in(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("INFERLAB_LLAMA_CPP_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["tune", "--engine", "llama-server", "--json", str(tmp_path / "x.json")]) == 2
    assert f"no llama-server in {tmp_path / 'bin'} or on PATH" in capsys.readouterr().err


def test_the_chosen_command_says_the_context_each_slot_holds(tmp_path, capsys):
    out = tmp_path / "tune.json"
    exe, ggufs = stand_in(tmp_path), str(gguf_dir(tmp_path))
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(exe), "--gguf-dir", ggufs,
                 "--batch", "2", "--formats", "bf16", "--draft", "0", "--rates", "50", "--num-requests", "2",
                 "--max-tokens", "2", "4", "--quality-prompts", "1", "--quality-tokens", "2", "--repeats", "2",
                 "--ctx-per-slot", "1536", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (point,) = result["points"]
    assert "-np 2 -c 3072 " in point["command"] and point["repeats"] == 2 and len(point["repeat_runs"]) == 1
    chosen = result["chosen"]
    assert chosen["context"]["per_slot"] == 1536 and chosen["context"]["total"] == 3072
    assert chosen["context_said"].startswith("-np 2 -c 3072: 1536 tokens a slot")
    assert "context: -np 2 -c 3072" in capsys.readouterr().err
    assert main(["tune", "--engine", "llama-server", "--server-bin", str(exe), "--gguf-dir", ggufs,
                 "--ctx-per-slot", "64", "--json", str(out)]) == 2
    assert "--ctx-per-slot 64: shorter than the sweep's longest request" in capsys.readouterr().err


def test_port_reaches_the_tuned_servers_and_the_managed_one(tmp_path):
    from app.cli import build_parser
    from app.managed.child import free_port
    from app.tradeoff.tune_cli import make_spec

    port = free_port()
    args = build_parser().parse_args(["tune", "--engine", "llama-server", "--server-bin", str(stand_in(tmp_path)),
                                      "--gguf-dir", str(gguf_dir(tmp_path)), "--port", str(port), "--json", "x"])
    spec = make_spec(args, lambda line: None)
    assert spec.port == port
    from app.tradeoff.tune import run_point

    result = run_point(spec, spec.points[0], None, lambda text: None)
    assert f"--port {port}" in result["command"]
    app_args = build_parser().parse_args(["--manage", "llama-server", "--port", str(port)])
    assert app_args.port == port


def test_load_keeps_one_run_by_default():
    assert TuneLoad().repeats == 1 and TuneLoad().as_dict()["repeats"] == 1
