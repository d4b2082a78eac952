"""The comparison runner on a tiny model: seeded workloads, isolation from a live engine, the run modes,
stored results. No timing asserts: only counts, token ids and the shape of the results."""
from __future__ import annotations

import json

import pytest

from app.talk.compare.drive import Cancelled
from app.talk.compare.runner import run_comparison
from app.talk.compare.spec import parse_compare
from app.talk.compare.store import load_stored, prepared_json, save_result
from app.talk.compare.workload import plan
from engine import EngineConfig, LLMEngine
from engine.core.metrics import SLO
from engine.loading.loader import load_model

CORPUS = list(range(5, 300))


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return load_model(str(tiny_llama))


def _base(tiny_llama) -> EngineConfig:
    return EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=96, attention_backend="fast",
                        num_threads=1)


def _spec(**over) -> dict:
    d = {"title": "t", "knob": "max_num_seqs", "values": [1, 4],
         "metrics": ["tokens_per_s", "p99_e2e_ms", "kv_blocks_peak", "same_output_as_first_pct"],
         "workload": {"requests": 5, "prompt_tokens": [8, 20], "output_tokens": [3, 8], "seed": 3}}
    d.update(over)
    return d


def test_workload_is_planned_from_the_seed():
    w = parse_compare(_spec(workload={"requests": 6, "arrival": "poisson", "seed": 9})).workload
    a, b = plan(w, CORPUS, 256), plan(w, CORPUS, 256)
    assert a == b and len(a) == 6
    other = plan(parse_compare(_spec(workload={"requests": 6, "arrival": "poisson", "seed": 10})).workload,
                 CORPUS, 256)
    assert [p.prompt_token_ids for p in a] != [p.prompt_token_ids for p in other]
    assert a[0].at_unit == 0 and all(x.at_unit <= y.at_unit for x, y in zip(a, a[1:]))
    burst = plan(parse_compare(_spec(workload={"requests": 4, "arrival": "burst", "burst_requests": 2,
                                               "burst_prompt_tokens": [40, 50]})).workload, CORPUS, 256)
    assert sum(p.kind == "burst" for p in burst) == 2 and [p.index for p in burst] == list(range(6))


def test_same_tokens_under_batch_sizes_and_live_engine_sees_nothing(loaded, tiny_llama):
    live = LLMEngine(_base(tiny_llama), loaded=loaded)
    seen = []
    live.add_listener(seen.append)
    result = run_comparison(parse_compare(_spec()), loaded, _base(tiny_llama))
    assert seen == [] and live.stats().num_requests == 0
    rows = result["comparison"]
    assert [r["label"] for r in rows] == ["max_num_seqs = 1", "max_num_seqs = 4"]
    assert rows[0]["config"] == {"mode": "continuous", "max_num_seqs": 1}
    # greedy, the batch size does not change the maths: the same token ids in both (float32)
    assert rows[1]["metrics"]["same_output_as_first_pct"] == 100.0
    assert rows[0]["metrics"]["tokens_per_s"] > 0 and rows[0]["metrics"]["kv_blocks_peak"] >= 1
    assert result["machine"]["threads"] >= 1 and result["measured_at"][:2] == "20"
    assert set(result["metric_info"]) == set(result["metrics"])


def test_modes_static_recompute_and_computed(loaded, tiny_llama):
    spec = parse_compare({
        "title": "modes", "metrics": ["tokens_per_s", "kv_blocks_peak", "tokens_computed_per_output_token",
                                      "same_output_as_first_pct", "prefix_cache_saved_tokens"],
        "engine": {"max_num_seqs": 2},
        "workload": {"requests": 4, "prompt_tokens": [8, 12], "output_tokens": [4, 6], "shared_prefix_tokens": 32},
        "configs": [{"label": "continuous"}, {"label": "static", "mode": "static"},
                    {"label": "no KV cache", "mode": "recompute"}, {"label": "contiguous", "mode": "contiguous"}]})
    progress = []
    rows = run_comparison(spec, loaded, _base(tiny_llama), progress=lambda t, f: progress.append(f))["comparison"]
    cont, static, recompute, contiguous = (r["metrics"] for r in rows)
    assert static["same_output_as_first_pct"] == 100.0 and recompute["same_output_as_first_pct"] == 100.0
    assert cont["prefix_cache_saved_tokens"] >= 32  # later requests reuse the shared prefix's blocks
    assert "prefix_cache_saved_tokens" not in recompute or recompute["prefix_cache_saved_tokens"] == 0
    # without a KV cache every token recomputes its whole prefix: more work per output token
    assert recompute["tokens_computed_per_output_token"] > 3 * cont["tokens_computed_per_output_token"]
    assert rows[3]["computed"] is True and "computed, not run" in rows[3]["note"]
    assert contiguous["kv_blocks_peak"] > cont["kv_blocks_peak"]
    assert progress[-1] == 1.0 and progress == sorted(progress)


def test_goodput_and_rate_knob(loaded, tiny_llama):
    names = ["goodput_rps", "slo_attainment_pct", "p50_queue_ms"]
    spec = parse_compare(_spec(knob="rate", values=[50.0, 200.0], metrics=names,
                               workload={"requests": 3, "arrival": "poisson", "output_tokens": [2, 3]}))
    rows = run_comparison(spec, loaded, _base(tiny_llama), slo=SLO(10.0, 10.0))["comparison"]
    assert [r["config"]["rate"] for r in rows] == [50.0, 200.0]
    assert all(r["metrics"]["slo_attainment_pct"] == 100.0 for r in rows)
    split = rows[1]["requests"]  # each request's queue / prefill / decode, in arrival order
    assert [s["id"] for s in split] == ["c1-0", "c1-1", "c1-2"]
    assert all(s["queue_ms"] >= 0 and s["prefill_ms"] > 0 and s["decode_ms"] >= 0 for s in split)


def test_cancel_and_not_built(loaded, tiny_llama):
    with pytest.raises(Cancelled):
        run_comparison(parse_compare(_spec()), loaded, _base(tiny_llama), cancelled=lambda: True)
    r = run_comparison(parse_compare({"title": "LoRA", "not_built": "not built yet"}), loaded, _base(tiny_llama))
    assert r["comparison"] == [] and r["not_built"] == "not built yet"


def test_mtp_without_heads_falls_back_to_ngram(loaded, tiny_llama):
    spec = parse_compare(_spec(knob=None, values=None, metrics=["tokens_per_s", "same_output_as_first_pct"],
                               configs=[{"label": "off"}, {"label": "MTP", "spec_method": "mtp",
                                                           "num_speculative_tokens": 2}]))
    rows = run_comparison(spec, loaded, _base(tiny_llama))["comparison"]
    assert "n-gram" in rows[1]["label"] and "heads" in rows[1]["note"]
    assert rows[1]["metrics"]["same_output_as_first_pct"] == 100.0  # exact verification: same greedy text


def test_stored_results_round_trip(tmp_path):
    machine = {"cpu": "Test CPU 9000", "gpu": None, "threads": 2, "torch": "2.x"}
    result = {"title": "t", "machine": machine, "measured_at": "2026-01-01T00:00:00+00:00", "fingerprint": "abc",
              "metrics": ["tokens_per_s"], "comparison": [{"label": "a", "config": {"k": 1},
                                                          "metrics": {"tokens_per_s": 3.5}}]}
    path = save_result("kv-cache", "smollm2-135m", result, root=tmp_path)
    assert path.is_file() and "test-cpu-9000-2t" in str(path)
    got = load_stored("kv-cache", "smollm2-135m", machine, root=tmp_path)
    assert got["comparison"] == result["comparison"] and got["model"] == "smollm2-135m"
    assert load_stored("kv-cache", "smollm2-135m", machine, fingerprint="other", root=tmp_path) is None
    assert load_stored("kv-cache", "other-model", machine, root=tmp_path) is None
    path.write_text("{ broken")
    assert load_stored("kv-cache", "smollm2-135m", machine, root=tmp_path) is None
    doc = prepared_json("smollm2-135m", machine, {"kv-cache": result})
    assert json.loads(json.dumps(doc))["presets"]["kv-cache"]["comparison"][0]["metrics"] == {"tokens_per_s": 3.5}
    # the same CPU made to run as AVX2 with emulated bf16 keeps its figures apart from its native ones
    posing = {**machine, "as": "avx2-emulated-bf16"}
    path = save_result("kv-cache", "smollm2-135m", {**result, "machine": posing}, root=tmp_path)
    assert "test-cpu-9000-2t-as-avx2-emulated-bf16" in str(path)
    assert load_stored("kv-cache", "smollm2-135m", posing, root=tmp_path)["machine"] == posing
    assert load_stored("kv-cache", "smollm2-135m", machine, root=tmp_path) is None  # the native file is its own


def test_machine_info_says_which_tier_the_cpu_was_made_to_run_as(monkeypatch):
    from app.talk.compare.machine import machine_info, machine_key, machine_text
    from engine import kernels

    monkeypatch.delenv("INFERLAB_CPU_TIER", raising=False)
    monkeypatch.delenv("INFERLAB_EMULATED_BF16", raising=False)
    native = machine_info()
    assert native["as"] is None and "-as-" not in machine_key(native)
    monkeypatch.setenv("INFERLAB_EMULATED_BF16", "1")
    posing = machine_info()
    assert posing["as"].endswith("emulated-bf16") and machine_key(posing).endswith("-as-" + posing["as"])
    assert f", as {posing['as']}," in machine_text(posing)
    if "avx2" in kernels.supported_tiers()[:-1]:  # a CPU above AVX2 can be told to run as one
        monkeypatch.setenv("INFERLAB_CPU_TIER", "avx2")
        assert machine_info()["as"] == "avx2-emulated-bf16"


def test_job_stores_and_the_preset_finds_it_at_once(loaded, tiny_llama, tmp_path, monkeypatch):
    from app.talk.compare.job import ComparisonJob
    from app.talk.presets import Preset

    monkeypatch.setenv("INFERLAB_DATA_DIR", str(tmp_path))
    preset = Preset(name="mine", path="mine.toml", title="t", caption="c", compare=parse_compare(_spec(values=[2])))
    job = ComparisonJob(preset, "tiny")
    assert job.stored() is None
    result = job(loaded, _base(tiny_llama))
    assert job.stored()["comparison"] == result["comparison"]
    changed = Preset(name="mine", path="mine.toml", title="t", caption="c", compare=parse_compare(_spec(values=[3])))
    assert ComparisonJob(changed, "tiny").stored() is None  # another [compare] section: not its result


def test_bandwidth_metrics_come_from_sizes_and_label_the_ceiling_predicted(loaded, tiny_llama):
    names = ["decode_tokens_per_s", "predicted_decode_tokens_per_s", "bytes_per_decode_step", "probe_gb_per_s"]
    spec = parse_compare(_spec(values=[2], metrics=names, workload={"requests": 2, "output_tokens": [6, 6]}))
    engine = LLMEngine(_base(tiny_llama), loaded=loaded)
    mem = engine.memory()
    m = run_comparison(spec, loaded, _base(tiny_llama))["comparison"][0]["metrics"]
    weights_read = mem.weights_bytes - mem.packed_weights_bytes
    # one copy of the weights plus the KV of both requests' contexts
    assert weights_read < m["bytes_per_decode_step"] < weights_read + 2 * 64 * mem.kv_block_bytes
    assert m["probe_gb_per_s"] > 0 and m["predicted_decode_tokens_per_s"] > 0


def test_adapter_mix_registers_adapters_and_counts_pool_traffic(loaded, tiny_llama):
    """The `adapters` knob: requests name N adapters in turn; with fewer device slots than adapters the
    pool loads and evicts during the run (counted), and adapters beyond the trained ones are random ones,
    which the entry says."""
    spec = parse_compare({
        "title": "mix", "metrics": ["tokens_per_s", "adapters_in_mix", "adapter_loads", "adapter_evictions", "steps"],
        "engine": {"max_loras": 1, "max_lora_rank": 8, "max_num_seqs": 4},
        "workload": {"requests": 6, "prompt_tokens": [8, 12], "output_tokens": [3, 5], "seed": 2},
        "configs": [{"label": "base", "max_loras": 0}, {"label": "3 adapters", "adapters": 3}]})
    rows = run_comparison(spec, loaded, _base(tiny_llama))["comparison"]
    base, mixed = rows[0]["metrics"], rows[1]["metrics"]
    assert base["adapters_in_mix"] == 0 and "adapter_loads" not in base  # no pool at all
    assert mixed["adapters_in_mix"] == 3
    assert mixed["adapter_loads"] >= 2 and mixed["adapter_evictions"] >= 1  # one slot, three adapters
    assert mixed["steps"] > base["steps"]  # a step admits one adapter's requests only
    assert "3 of the 3 adapters are random" in rows[1]["note"]


def test_rates_as_multiples_of_a_measured_capacity(loaded, tiny_llama):
    """rate_unit = "capacity": the capacity is measured first (all at once), the rates are multiples of
    it in the labels and in requests/s, and the request count follows from it (3x the requests started
    within the TTFT budget, at least the preset's)."""
    import math

    over = dict(knob="rate", values=[0.5, 8.0], metrics=["goodput_rps", "p50_queue_ms"], engine={"max_num_seqs": 2},
                workload={"requests": 3, "arrival": "poisson", "rate_unit": "capacity", "output_tokens": [2, 4]})
    spec = parse_compare(_spec(**over))
    per_s = {**over, "workload": {**over["workload"], "rate_unit": "per_s"}}
    assert spec.fingerprint() != parse_compare(_spec(**per_s)).fingerprint()
    result = run_comparison(spec, loaded, _base(tiny_llama), slo=SLO(0.05, 10.0))
    cap = result["capacity"]
    assert cap["capacity_rps"] > 0 and cap["served_within_ttft_budget"] == pytest.approx(2 + cap["capacity_rps"] * 0.05)
    assert cap["requests"] == max(3, math.ceil(3 * cap["served_within_ttft_budget"]))
    rows = result["comparison"]
    rps = cap["capacity_rps"]
    assert [r["config"]["rate_per_s"] for r in rows] == pytest.approx([0.5 * rps, 8 * rps])
    assert rows[0]["label"].startswith("0.5x capacity (") and rows[1]["label"].startswith("8x capacity (")
    assert len(rows[1]["requests"]) == cap["requests"]  # every planned request ran, at the scaled rate


def test_named_rate_configs_keep_their_words_and_checks_find_them(loaded, tiny_llama):
    """Named configurations at capacity multiples (the latency-budget chapter's plain and budget-aware
    scheduler at the same rate): the label keeps the preset's words with the rate in requests/s after them,
    and a check names the row by the preset's label."""
    from app.talk.chapter_check import evaluate_checks

    spec = parse_compare({
        "title": "budget", "metrics": ["goodput_rps"], "engine": {"max_num_seqs": 2},
        "workload": {"requests": 3, "arrival": "poisson", "rate_unit": "capacity", "output_tokens": [2, 4]},
        "configs": [{"label": "2x", "rate": 2.0},
                    {"label": "2x, told the budget", "rate": 2.0, "ttft_budget_ms": 50.0, "tpot_budget_ms": 10000.0}],
        "checks": [{"claim": "c", "metric": "goodput_rps", "expect": "at_least", "config": "2x, told the budget",
                    "value": 0.0}]})
    result = run_comparison(spec, loaded, _base(tiny_llama), slo=SLO(0.05, 10.0))
    rows = result["comparison"]
    rps = result["capacity"]["capacity_rps"]
    assert [r["spec_label"] for r in rows] == ["2x", "2x, told the budget"]
    assert rows[1]["label"] == f"2x, told the budget ({2 * rps:.2g}/s)"
    assert rows[1]["config"]["ttft_budget_ms"] == 50.0 and rows[0]["config"]["rate_per_s"] == pytest.approx(2 * rps)
    [verdict] = evaluate_checks(spec.checks, result)
    assert verdict["holds"] is True and "2x, told the budget" in verdict["figures"]


def test_inter_token_gaps_are_per_answer_and_show_a_frozen_stream():
    """max_itl_ms: the longest wait between two steps that gave one answer tokens (the traffic-jam
    chapter's "nobody freezes"); a request's first token and other requests' tokens are not gaps."""
    from app.talk.compare.collect import RunRecord
    from app.talk.compare.metrics import run_metrics
    from engine.events import EngineStepEvent, RequestOutput, StepStats

    def step(i: int, t: float, wall: float, outs) -> EngineStepEvent:
        stats = StepStats(step=i, t_start=t, wall_time_s=wall, num_prefill_tokens=0, num_decode_tokens=len(outs),
                          num_running=len(outs), num_waiting=0, num_preempted=0, kv_blocks_used=1, kv_blocks_total=8)
        return EngineStepEvent(stats, tuple(RequestOutput(rid, (1,), "", (1,), "", fin) for rid, fin in outs))

    rec = RunRecord(t_start=0.0, t_end=3.0)
    rec.on_event(step(0, 0.0, 0.1, [("a", False)]))  # a's first token at 0.1: no gap yet
    rec.on_event(step(1, 0.1, 0.1, [("a", False), ("b", False)]))  # a: 0.1 s; b's first
    rec.on_event(step(2, 0.2, 2.0, [("b", False)]))  # a prompt's long step: b waited 2.0 s, a gave nothing
    rec.on_event(step(3, 2.2, 0.1, [("a", True), ("b", True)]))  # a: 2.1 s since 0.2; b: 0.1 s
    assert sorted(round(g, 6) for g in rec.itl) == [0.1, 0.1, 2.0, 2.1]
    m = run_metrics(rec, None, 6)
    assert m["max_itl_ms"] == pytest.approx(2100.0) and 2000.0 < m["p99_itl_ms"] <= 2100.0
    assert rec.last_token_at == {}  # finished answers are forgotten


def test_rounds_run_the_configurations_in_turn_and_keep_each_figures_median(loaded, tiny_llama, monkeypatch):
    """rounds = 3: the configurations run A B A B A B (the machine's drift falls on both alike), the first
    round with the preset's warm-up and the later ones with the short one; each figure is the median of
    its rounds (all kept in `by_round`), warmup_s the first round's. rounds = 1 keeps the old fingerprint."""
    import statistics

    from app.talk.compare import runner

    order, warmups = [], []
    real_run_one, real_warm_up = runner._run_one, runner._warm_up
    monkeypatch.setattr(runner, "_run_one",
                        lambda spec, c, *a, **k: order.append(c.label) or real_run_one(spec, c, *a, **k))
    monkeypatch.setattr(runner, "_warm_up", lambda engine, spec, *a: warmups.append(spec.workload.warmup)
                        or real_warm_up(engine, spec, *a))
    over = {"values": [1, 2], "metrics": ["tokens_per_s", "same_output_as_first_pct", "perplexity"],
            "workload": {"requests": 3, "prompt_tokens": [8, 12], "output_tokens": [3, 5], "warmup": "workload"}}
    once = parse_compare(_spec(**over))
    spec = parse_compare(_spec(**{**over, "workload": {**over["workload"], "rounds": 3}}))
    assert spec.workload.rounds == 3 and once.workload.rounds == 1
    assert once.fingerprint() == parse_compare(_spec(**over)).fingerprint() != spec.fingerprint()
    progress = []
    result = run_comparison(spec, loaded, _base(tiny_llama), progress=lambda t, f: progress.append((t, f)))
    assert order == ["max_num_seqs = 1", "max_num_seqs = 2"] * 3
    assert warmups == ["workload", "workload", "short", "short", "short", "short"]
    assert result["rounds"] == 3 and any("round 3/3" in t for t, _ in progress)
    assert [f for _, f in progress] == sorted(f for _, f in progress)
    for row in result["comparison"]:
        rounds = row["by_round"]
        assert len(rounds["tokens_per_s"]) == 3
        assert row["metrics"]["tokens_per_s"] == statistics.median(rounds["tokens_per_s"])
        assert rounds["same_output_as_first_pct"] == [100.0] * 3  # each round against its own first config
        assert len(rounds["perplexity"]) == 1 and row["metrics"]["perplexity"] > 1  # the weights': measured once
    with pytest.raises(ValueError, match="rounds"):
        parse_compare(_spec(workload={"rounds": 0}))
