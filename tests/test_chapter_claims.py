"""Chapter checks that mean it (issue 49, point 2): "rises" / "falls" only for a series that goes one way,
a multi-round verdict the rounds disagree on is "too close to call" instead of flipping, batch sweeps at
multiples of this machine's roofline knee with the regime said, the headline a chapter's claim is about,
streaming's before/after, and every preset's claims naming configurations it has."""
from __future__ import annotations

import types

import pytest

from app.talk.chapter_check import CheckSpec, evaluate_check, monotonic
from app.talk.compare.headline import headline_text
from app.talk.compare.knee import Knee, knee_from_roofs, knee_label
from app.talk.compare.runner import run_comparison
from app.talk.compare.spec import CompareSpecError, parse_compare
from app.talk.presets import available, load_preset
from engine import EngineConfig
from engine.loading.loader import load_model
from widgets.comparison_format import headline_line


def result(rows: dict[str, dict], **extra) -> dict:
    return {"comparison": [{"label": k, "config": {}, "metrics": v} for k, v in rows.items()], **extra}


def test_rises_means_every_step_rises():
    """latency-budget's tokens/s 38.8 -> 93.6 -> 67.2 was held as "rises" (last above first)."""
    rows = result({"0.5x": {"tokens_per_s": 38.8}, "2x": {"tokens_per_s": 93.6}, "8x": {"tokens_per_s": 67.2}})
    verdict = evaluate_check(CheckSpec("tokens/s rises", "tokens_per_s", "rises"), rows)
    assert verdict["holds"] is False and verdict["figures"] == "tokens_per_s: 38.8 → 93.6 → 67.2"
    assert monotonic([1.0, 2.0, 3.0], "rises") and monotonic([3.0, 2.0, 1.0], "falls")
    assert not monotonic([3.0, 1.0, 2.0], "falls") and not monotonic([1.0, 1.0], "rises")
    assert monotonic([1.0, 0.98, 2.0], "rises", slack=0.05)  # a flat step within the tolerance


def _rounds(a: list[float], b: list[float]) -> dict:
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return {"comparison": [
        {"label": "eager", "config": {}, "metrics": {"ms": med(a)}, "by_round": {"ms": a}},
        {"label": "compiled", "config": {}, "metrics": {"ms": med(b)}, "by_round": {"ms": b}}]}


FASTER = CheckSpec("compiled steps are faster", "ms", "lower", config="compiled", than="eager")


def test_a_verdict_the_rounds_disagree_on_is_too_close_to_call():
    """compilation's verdict flipped run to run (eager 21.5 vs compiled 22.6, then 32.6 vs 23.1)."""
    mixed = evaluate_check(FASTER, _rounds([21.5, 32.6, 22.0, 25.0, 23.0], [22.6, 23.1, 22.4, 24.0, 23.5]))
    assert mixed["holds"] is None and "too close to call" in mixed["figures"] and "of 5 rounds" in mixed["figures"]
    clear = evaluate_check(FASTER, _rounds([30.0, 31.0, 29.0, 30.5, 28.0], [22.0, 23.0, 21.0, 22.5, 24.0]))
    assert clear["holds"] is True
    against = evaluate_check(FASTER, _rounds([20.0, 21.0, 19.0, 20.5, 19.5], [22.0, 23.0, 21.0, 22.5, 24.0]))
    assert against["holds"] is False  # every round says the opposite: a contradiction, stably


def test_the_knee_comes_from_the_roofs():
    roofs = types.SimpleNamespace(peak_flops={"bfloat16": 39e9, "float32": 15e9}, bandwidth_bytes_per_s=7e9,
                                  how="probe", flops_roof=lambda d="bfloat16": {"bfloat16": 39e9, "float32": 15e9}[d])
    knee = knee_from_roofs(roofs, "bfloat16")
    assert knee.batch == round(39e9 / 7e9) and knee.bytes_per_weight == 2.0
    assert knee_from_roofs(roofs, "float32").batch == round(15e9 / 7e9 * 2)  # 4-byte weights: 2 FLOPs per byte
    assert knee.batch_for(0.01) == 1 and knee.batch_for(4) == 4 * knee.batch
    assert knee.regime().startswith(f"batch is nearly free up to ~{knee.batch} here")
    assert knee_label(1, 0.01) == "batch 1" and knee_label(6, 1) == "batch 6 (the knee)"


def test_knee_values_parse_only_for_the_batch_knob():
    spec = parse_compare({"title": "t", "knob": "max_num_seqs", "values_unit": "knee", "values": [0.01, 1, 4],
                          "workload": {"requests_per_batch": 1}})
    assert [c.label for c in spec.configs] == ["0.01x knee", "1x knee", "4x knee"]
    with pytest.raises(CompareSpecError, match="values_unit"):
        parse_compare({"title": "t", "knob": "quant_bits", "values_unit": "knee", "values": [1]})
    with pytest.raises(CompareSpecError, match="headline"):
        parse_compare({"title": "t", "knob": "max_num_seqs", "values": [1], "headline": "steps"})


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return load_model(str(tiny_llama))


def test_a_knee_sweep_runs_at_this_machines_batches_and_says_the_regime(loaded, tiny_llama, monkeypatch):
    knee = Knee(batch=3, ridge_flops_per_byte=3.0, peak_flops=21e9, bandwidth_bytes_per_s=7e9,
                bytes_per_weight=2.0, roofs_how="fake")
    monkeypatch.setattr("app.talk.compare.runner.measure_knee", lambda device, dtype: knee)
    spec = parse_compare({"title": "t", "knob": "max_num_seqs", "values_unit": "knee", "values": [0.01, 1, 2],
                          "metrics": ["decode_tokens_per_s", "per_user_tokens_per_s"],
                          "workload": {"requests": 2, "requests_per_batch": 1, "prompt_tokens": [8, 12],
                                       "output_tokens": [3, 4]},
                          "checks": [{"claim": "c", "metric": "per_user_tokens_per_s", "expect": "lower",
                                      "config": "2x knee", "than": "1x knee"}]})
    base = EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=96, num_threads=1)
    r = run_comparison(spec, loaded, base)
    assert [row["label"] for row in r["comparison"]] == ["batch 1", "batch 3 (the knee)", "batch 6 (2x the knee)"]
    assert [row["spec_label"] for row in r["comparison"]] == ["0.01x knee", "1x knee", "2x knee"]
    assert [row["config"]["max_num_seqs"] for row in r["comparison"]] == [1, 3, 6]
    assert r["regime"] == knee.regime() and r["knee"]["batch"] == 3
    assert evaluate_check(spec.checks[0], r)["figures"] != "figures missing"  # the preset's names still resolve


def test_streaming_compares_the_first_token_with_the_whole_answer(loaded, tiny_llama):
    spec = parse_compare({"title": "t", "metrics": ["p50_first_text_ms", "p50_ttft_ms", "p50_e2e_ms"],
                          "workload": {"requests": 3, "prompt_tokens": [8, 12], "output_tokens": [4, 6]},
                          "configs": [{"label": "streamed"}, {"label": "not streamed", "streamed": False}]})
    r = run_comparison(spec, loaded, EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=96,
                                                   num_threads=1))
    streamed, whole = (row["metrics"] for row in r["comparison"])
    assert streamed["p50_first_text_ms"] == streamed["p50_ttft_ms"]
    assert whole["p50_first_text_ms"] == whole["p50_e2e_ms"]


def test_the_headline_is_the_claims_number():
    """prefill-vs-decode printed its prefill headline on a decode claim."""
    r = {"metrics": ["prefill_tokens_per_s", "decode_tokens_per_s"], "headline": "decode_tokens_per_s",
         "comparison": [{"label": "1", "metrics": {"prefill_tokens_per_s": 140.0, "decode_tokens_per_s": 14.5}},
                        {"label": "8", "metrics": {"prefill_tokens_per_s": 160.0, "decode_tokens_per_s": 94.4}}]}
    assert headline_text(r).startswith("decode_tokens_per_s: 1: 14.5; 8: 94.4 (6.51x)")
    assert headline_line(r) == "decode tokens/s: 8 94.4 vs 1 14.5 (6.51x)"
    assert load_preset("prefill-vs-decode").compare.headline == "decode_tokens_per_s"


def test_the_headline_pairs_what_the_chapters_first_claim_compares():
    r = {"metrics": ["decode_step_ms_median"], "comparison": [
        {"label": "eager", "metrics": {"decode_step_ms_median": 30.0}},
        {"label": "torch.compile", "metrics": {"decode_step_ms_median": 20.0}},
        {"label": "native fused step", "metrics": {"decode_step_ms_median": 10.0}}],
        "checks": [{"metric": "decode_step_ms_median", "config": "torch.compile", "than": "eager"}]}
    assert headline_line(r) == "decode step median (ms): torch.compile 20 vs eager 30 (0.67x)"


def test_vram_bottlenecks_caption_and_comparison_name_the_same_blocks():
    preset = load_preset("vram-bottleneck")
    cut = [c for c in preset.compare.configs if "num_kv_blocks" in c.knobs]
    assert [c.knobs["num_kv_blocks"] for c in cut] == [preset.engine["num_kv_blocks"]] == [160]
    assert "160 blocks" in preset.caption and "160" in cut[0].label


@pytest.mark.parametrize("name", available())
def test_every_presets_claims_name_its_own_configurations(name):
    spec = load_preset(name).compare
    if spec is None or spec.not_built:
        return
    labels = {c.label for c in spec.configs} | {"first", "last"}
    for check in spec.checks:
        assert {check.config, check.than} - {None} <= labels, (name, check)
