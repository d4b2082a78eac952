"""The tradeoff sweep on a tiny model: isolation from the live engine, measured vs predicted kept apart,
frontiers, the stored result and the probe's cache (no timing asserts)."""
from __future__ import annotations

import json

import pytest

from app.tradeoff.frontier import cheapness, pareto, speed
from app.tradeoff.sweep import SweepSpec, run_sweep
from app.tradeoff.sweep_point import Workload
from app.tradeoff.sweep_store import export_csv, load, save
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.loading.loader import load_model
from engine.perf.roofline import Roofs

ROOFS = Roofs("test cpu", 1, "test", {"bfloat16": 1e11, "float32": 2.5e10}, 1e10, "synthetic (test)", "now")


@pytest.fixture(scope="module")
def sweep_result(tiny_llama):
    live = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64))
    seen = []
    live.add_listener(seen.append)
    live.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    while live.has_unfinished():
        live.step()
    before = len(seen)
    # bf16 and fp8-e4m3: a format named, not a bit count (fp8 shares int8's), carried through the sweep
    spec = SweepSpec(max_num_seqs=(1, 2), quant_format=("bf16", "fp8-e4m3"), num_speculative_tokens=(0, 2),
                     warmup_s=0.05, measure_s=0.3,
                     memory_budget_bytes=32 * 2**20, workload=Workload(prompt_tokens=(8, 24), output_tokens=(4, 8)))
    result = run_sweep(load_model(str(tiny_llama)), live.config, spec, ROOFS)
    return result, seen, before


def test_sweep_never_reaches_the_live_engine(sweep_result):
    result, seen, before = sweep_result
    assert len(seen) == before  # not one event of the sweep reached the live engine's listeners
    assert len(result["points"]) == 8


def test_points_are_measured_and_carry_every_field(sweep_result):
    result, _, _ = sweep_result
    json.dumps(result)  # plain JSON
    for p in result["points"]:
        assert p["predicted"] is False
        for key in ("max_num_seqs", "quant_format", "num_speculative_tokens", "tokens_per_s_user", "tokens_per_s_total",
                    "usd_per_mtok",
                    "ppl_delta_pct", "kl", "agreement", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms",
                    "p99_tpot_ms", "weights_bytes", "kv_blocks"):
            assert key in p
        assert p["tokens_per_s_total"] > 0 and p["tokens_per_s_user"] > 0
    eight = [p for p in result["points"] if p["quant_format"] == "fp8-e4m3"]
    sixteen = [p for p in result["points"] if p["quant_format"] == "bf16"]
    assert all(p["kl"] == 0.0 and p["agreement"] == 1.0 for p in sixteen)
    assert all(p["kl"] > 0 and p["agreement"] <= 1.0 for p in eight)
    assert len({p["kl"] for p in eight}) == 1  # measured once per format, reused
    assert eight[0]["weights_bytes"] < sixteen[0]["weights_bytes"]


def test_predicted_points_are_kept_apart(sweep_result):
    result, _, _ = sweep_result
    assert result["predicted"], "the calibration should have found prefill and decode steps"
    assert all(p["predicted"] is True for p in result["predicted"])
    assert not any(p.get("predicted") for p in result["points"])
    assert {p["device"] for p in result["predicted"]} == {"A100", "H100", "H200"}
    measured_keys = [{k: p[k] for k in ("max_num_seqs", "quant_format", "num_speculative_tokens")}
                     for p in result["points"]]
    assert all(f in measured_keys for f in result["frontier"])  # the frontier holds measured points only
    assert result["roofline"]["how"] == "synthetic (test)"


def test_pareto_by_hand():
    pts = [{"tokens_per_s_user": 10, "usd_per_mtok": 5.0}, {"tokens_per_s_user": 20, "usd_per_mtok": 8.0},
           {"tokens_per_s_user": 5, "usd_per_mtok": 6.0}, {"tokens_per_s_user": 20, "usd_per_mtok": 9.0}]
    assert pareto(pts, (speed, cheapness)) == [0, 1]


def test_store_and_csv(sweep_result, tmp_path):
    result, _, _ = sweep_result
    save(result, "test cpu", "/models/tiny", base=tmp_path)
    back = load("test cpu", "/models/tiny", base=tmp_path)
    assert back["points"] == json.loads(json.dumps(result["points"]))
    assert load("other cpu", "/models/tiny", base=tmp_path) is None
    export_csv(result, tmp_path / "points.csv")
    rows = (tmp_path / "points.csv").read_text().splitlines()
    assert len(rows) == 1 + len(result["points"]) + len(result["predicted"])
    assert rows[1].split(",")[-3] in ("True", "False") and rows[-1].split(",")[-3] == "True"


def test_probe_reads_its_cache(tmp_path):
    import torch

    from engine.perf.probe import cache_path, probe_roofs

    path = cache_path(torch.device("cpu"), tmp_path)
    path.write_text(json.dumps(ROOFS.to_dict()))
    assert probe_roofs(cache_dir=tmp_path) == ROOFS
