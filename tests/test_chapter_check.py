"""Issue 27, point 1: each chapter's claim is a check on its own measured figures. The check logic on
synthetic results (pass, fail, missing figures), the likely reasons, prepare's fallback (tried once,
kept only when it breaks fewer claims), the [compare.checks] / [compare.fallback] parsing with
file:line errors, and the flag on the comparison panel."""
from __future__ import annotations

import pytest

from app.talk.chapter_check import (
    CheckSpec,
    evaluate_check,
    likely_reasons,
    parse_check,
    too_slow_for_arrivals,
)
from app.talk.compare.prepare_chapter import check_lines, run_checked
from app.talk.compare.spec import parse_compare
from app.talk.presets import PRESETS_DIR, PresetError, available, load_preset


def result(rows: dict[str, dict], **extra) -> dict:
    return {"comparison": [{"label": k, "config": {}, "metrics": v} for k, v in rows.items()],
            "fingerprint": "f0", **extra}


CONTINUOUS = CheckSpec("continuous beats static", "tokens_per_s", "higher", config="continuous", than="static")


def test_higher_and_lower_hold_and_break():
    assert evaluate_check(CONTINUOUS, result({"static": {"tokens_per_s": 10.0},
                                              "continuous": {"tokens_per_s": 12.0}}))["holds"] is True
    broken = evaluate_check(CONTINUOUS, result({"static": {"tokens_per_s": 12.5},
                                                "continuous": {"tokens_per_s": 11.6}}))
    assert broken["holds"] is False and broken["figures"] == "tokens_per_s: continuous 11.6 vs static 12.5"
    slack = CheckSpec("c", "tokens_per_s", "higher", config="continuous", than="static", tolerance_pct=10)
    assert evaluate_check(slack, result({"static": {"tokens_per_s": 12.5},
                                         "continuous": {"tokens_per_s": 11.6}}))["holds"] is True
    lower = CheckSpec("spf cuts p99", "p99_ttft_ms", "lower", config="spf", than="fcfs")
    assert evaluate_check(lower, result({"fcfs": {"p99_ttft_ms": 900.0}, "spf": {"p99_ttft_ms": 1200.0}}))[
        "holds"] is False


def test_rises_falls_over_measured_rows_and_at_least():
    rows = {"rate = 1.0": {"goodput_rps": 0.0, "tokens_per_s": 5.0},
            "rate = 4.0": {"goodput_rps": 0.0, "tokens_per_s": 9.0},
            "contiguous": {"goodput_rps": 9.0}}
    r = result(rows)
    r["comparison"][2]["computed"] = True  # a computed row is not part of the curve
    assert evaluate_check(CheckSpec("c", "tokens_per_s", "rises"), r)["holds"] is True
    flat = evaluate_check(CheckSpec("goodput falls", "goodput_rps", "falls"), r)
    assert flat["holds"] is False and flat["figures"] == "goodput_rps: 0 → 0"  # 0 at every rate is no fall
    some = CheckSpec("some meet it", "goodput_rps", "at_least", config="rate = 1.0", value=0.01)
    assert evaluate_check(some, r)["holds"] is False
    first = CheckSpec("the lowest rate meets it", "goodput_rps", "at_least", config="first", value=0.01)
    assert evaluate_check(first, result({"rate = 0.25": {"goodput_rps": 0.3}, "rate = 1.0": {"goodput_rps": 0.0}}))[
        "holds"] is True  # "first": whatever a fallback's values label it
    exact = CheckSpec("same tokens", "same_output_as_first_pct", "at_least", value=100)
    assert evaluate_check(exact, result({"a": {"same_output_as_first_pct": 100.0},
                                         "b": {"same_output_as_first_pct": 25.0}}))["holds"] is False


def test_a_missing_figure_is_not_checked_rather_than_passed():
    verdict = evaluate_check(CONTINUOUS, result({"static": {"tokens_per_s": 10.0}, "continuous": {}}))
    assert verdict["holds"] is None and verdict["figures"] == "figures missing"
    lines = check_lines({"checks": [verdict]})
    assert lines[0].startswith("  not checked: continuous beats static") and "0 of 1 claims hold" in lines[-1]


def test_likely_reasons_busy_machine_emulated_bf16_and_a_slow_cpu():
    slow = result({"rate = 16.0": {"tokens_per_s": 8.7}}, workload={"arrival": "poisson", "output_tokens": [16, 32]})
    slow["comparison"][0]["config"] = {"rate": 16.0}
    reasons = likely_reasons(slow, {"load_before": [3.5, 3, 3], "load_after": [4.2, 3, 3], "cpus": 2, "threads": 1,
                                    "dtype": "bfloat16", "native_bf16": False})
    assert any(r.startswith("a busy machine: load average 3.5 before and 4.2 after, on 2 CPUs") for r in reasons)
    assert any(r.startswith("bf16 emulated") for r in reasons)
    assert "requests ask for 384 tok/s and it served 8.7 tok/s" in too_slow_for_arrivals(slow)
    quiet = likely_reasons(result({"a": {"tokens_per_s": 1.0}}), {"load_before": [0.2, 0, 0], "load_after": [1.1, 0, 0],
                                                                  "cpus": 2, "threads": 1, "dtype": "bfloat16",
                                                                  "native_bf16": True})
    assert quiet == []  # our own thread's load, native bf16, no arrival rate: nothing to blame


def test_fewer_but_dearer_steps_are_named_when_the_faster_schedule_loses():
    # continuous batching on a CPU whose 4-row step costs ~2.6x a 1-row one: a third fewer steps, no gain
    measured = result({"static": {"tokens_per_s": 101.0, "steps": 173},
                       "continuous": {"tokens_per_s": 93.0, "steps": 116}})
    measured["checks"] = [evaluate_check(CONTINUOUS, measured)]
    reasons = likely_reasons(measured, {})
    assert reasons == ["fewer steps, dearer steps: continuous took 33 % fewer engine steps than static (116 vs 173) "
                       "but each took 1.62x as long: on this CPU a step's time grows with the rows it carries "
                       "(batched requests, drafted tokens)"]
    # 101/93 x 173/116 = 1.62: wall per step, the requests' tokens being the same
    held = result({"static": {"tokens_per_s": 90.0, "steps": 173}, "continuous": {"tokens_per_s": 120.0, "steps": 116}})
    held["checks"] = [evaluate_check(CONTINUOUS, held)]
    assert likely_reasons(held, {}) == []  # a claim that holds needs no reason
    more = result({"static": {"tokens_per_s": 101.0, "steps": 100}, "continuous": {"tokens_per_s": 93.0, "steps": 120}})
    more["checks"] = [evaluate_check(CONTINUOUS, more)]
    assert likely_reasons(more, {}) == []  # no steps saved: nothing to say about their price
    no_steps = result({"static": {"tokens_per_s": 101.0}, "continuous": {"tokens_per_s": 93.0}})
    no_steps["checks"] = [evaluate_check(CONTINUOUS, no_steps)]
    assert likely_reasons(no_steps, {}) == []


def test_the_conditions_follow_the_engines_bf16_decision(monkeypatch):
    # INFERLAB_EMULATED_BF16 makes the engine compute as a CPU without bf16 does; the stored conditions
    # (and the likely reasons built on them) must say so, not the raw CPU flags
    from app.talk.compare import prepare_chapter
    from engine import kernels

    monkeypatch.setattr(kernels, "cpu_flags", lambda: ["avx2", "avx512f", "avx512_bf16"])
    monkeypatch.delenv("INFERLAB_EMULATED_BF16", raising=False)
    assert prepare_chapter.dtype_conditions("auto", "cpu") == {"dtype": "bfloat16", "native_bf16": True}
    monkeypatch.setenv("INFERLAB_EMULATED_BF16", "1")
    assert prepare_chapter.dtype_conditions("auto", "cpu") == {"dtype": "bfloat16", "native_bf16": False}
    monkeypatch.setattr(kernels, "cpu_flags", lambda: ["avx2", "fma"])
    monkeypatch.delenv("INFERLAB_EMULATED_BF16")
    assert prepare_chapter.dtype_conditions("auto", "cpu")["native_bf16"] is False
    assert prepare_chapter.dtype_conditions("float32", "cpu") == {"dtype": "float32", "native_bf16": None}


class Preset:
    def __init__(self, compare) -> None:
        self.name, self.compare = "latency-budget", compare


def _spec():
    """latency-budget's shape with fixed rates in requests/s and a fallback of 4x lower ones (the preset
    itself now scales its rates to a measured capacity instead)."""
    return parse_compare({
        "title": "goodput vs arrival rate", "knob": "rate", "values": [1.0, 4.0, 16.0],
        "metrics": ["goodput_rps", "tokens_per_s"], "workload": {"arrival": "poisson"},
        "checks": [{"claim": "goodput falls as the arrival rate rises", "metric": "goodput_rps", "expect": "falls"},
                   {"claim": "while tokens/s still rises", "metric": "tokens_per_s", "expect": "rises"},
                   {"claim": "at the lowest rate, requests meet the budget", "metric": "goodput_rps",
                    "expect": "at_least", "config": "first", "value": 0.01}],
        "fallback": {"reason": "arrival rates 4x lower (0.25, 1 and 4 per s)", "values": [0.25, 1.0, 4.0]}})


def _fake_run(goodput_by_rate: dict[float, float]):
    ran = []

    def run(spec) -> dict:
        ran.append(spec)
        rows = {c.label: {"goodput_rps": goodput_by_rate[c.knobs["rate"]], "tokens_per_s": 10.0 * c.knobs["rate"]}
                for c in spec.configs}
        return result(rows, fingerprint=spec.fingerprint())
    return run, ran


def test_prepare_passes_without_a_fallback():
    run, ran = _fake_run({1.0: 0.9, 4.0: 0.5, 16.0: 0.1})
    said = []
    out = run_checked(Preset(_spec()), run, {"threads": 1}, said.append)
    assert len(ran) == 1 and said == [] and all(v["holds"] for v in out["checks"])
    assert "load_before" in out["conditions"] and "check_reasons" not in out


def test_prepare_fails_then_its_fallback_holds_and_says_so():
    run, ran = _fake_run({1.0: 0.0, 4.0: 0.0, 16.0: 0.0, 0.25: 0.2})  # too slow for 1/s and up
    said = []
    spec = _spec()
    out = run_checked(Preset(spec), run, {"threads": 1}, said.append)
    assert [s.configs[0].label for s in ran] == ["rate = 1.0", "rate = 0.25"]  # the fallback, tried once
    assert "trying the fallback once: arrival rates 4x lower" in said[0] and "stored" in said[1]
    assert out["fallback"]["reason"].startswith("arrival rates 4x lower")
    assert [v["holds"] for v in out["fallback"]["first_try"]] == [False, True, False]
    assert out["fingerprint"] == spec.fingerprint()  # stored where the app looks for the chapter


def test_prepare_keeps_the_first_result_when_the_fallback_breaks_as_much():
    run, ran = _fake_run({1.0: 0.0, 4.0: 0.0, 16.0: 0.0, 0.25: 0.0})
    said = []
    out = run_checked(Preset(_spec()), run, {"threads": 1}, said.append)
    assert len(ran) == 2 and "fallback" not in out and out["fallback_tried"]["checks"]
    assert "breaks as many claims" in said[-1]
    assert any(line.startswith("  CONTRADICTS ITS CHAPTER: goodput falls") for line in check_lines(out))


def test_every_preset_with_a_comparison_states_its_claims():
    for name in available():
        spec = load_preset(name).compare
        if spec is not None and not spec.not_built and name != "streaming":
            assert spec.checks, name


@pytest.mark.parametrize("check, says", [
    ({"claim": "x", "metric": "nope", "expect": "rises"}, "metric: expected one of this comparison's metrics"),
    ({"claim": "x", "metric": "tokens_per_s", "expect": "bigger"}, "expect: expected one of higher"),
    ({"claim": "x", "metric": "tokens_per_s", "expect": "higher", "config": "a"}, "than: expect = 'higher' needs"),
    ({"claim": "x", "metric": "tokens_per_s", "expect": "higher", "config": "zz", "than": "a"}, "config: expected"),
    ({"claim": "x", "metric": "tokens_per_s", "expect": "at_least"}, "value: expect = 'at_least' needs a number"),
    ({"metric": "tokens_per_s", "expect": "rises"}, "claim: missing"),
])
def test_bad_checks_are_refused(check, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse_check(check, ("tokens_per_s",), ("a", "b"))


def test_a_bad_check_in_a_preset_file_names_its_line(tmp_path):
    text = (PRESETS_DIR / "continuous-batching.toml").read_text()
    bad = text.replace('expect = "higher"', 'expect = "bigger"')
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(PresetError) as info:
        load_preset(str(path))
    line = next(i for i, s in enumerate(bad.splitlines(), 1) if s.startswith('expect = "bigger"'))
    assert f":{line}" in str(info.value) and "expected one of higher" in str(info.value)


def test_fallback_parses_and_keeps_the_fingerprint_of_its_chapter():
    base = {"title": "t", "knob": "rate", "values": [1.0, 4.0], "metrics": ["goodput_rps"],
            "workload": {"arrival": "poisson"}}
    spec = parse_compare({**base, "fallback": {"reason": "slower", "values": [0.5], "workload": {"requests": 4}}})
    assert spec.fallback.configs[0].label == "rate = 0.5" and spec.fallback.workload.requests == 4
    assert spec.fallback.workload.arrival == "poisson"  # merged over [compare.workload]
    assert spec.fingerprint() == parse_compare(base).fingerprint()  # checks and fallbacks shape no result
    with pytest.raises(ValueError, match="reason"):
        parse_compare({**base, "fallback": {"values": [0.5]}})


def test_the_comparison_panel_flags_a_contradiction(qtbot):
    from widgets.comparison import ComparisonPanel

    panel = ComparisonPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 600)
    panel.show()
    r = result({"static": {"tokens_per_s": 12.5}, "continuous": {"tokens_per_s": 11.6}}, title="t",
               metrics=["tokens_per_s"], chart=["tokens_per_s"])
    r["checks"] = [evaluate_check(CONTINUOUS, r)]
    r["check_reasons"] = ["a busy machine: load average 3.5 before and 4.2 after"]
    panel.set_result(r)
    flag = panel.snapshot_data()["flag"]
    assert flag.startswith("⚠ not so here: continuous beats static (tokens_per_s: continuous 11.6")
    assert "likely: a busy machine" in flag and "load average" in panel.flag.toolTip()
    r["checks"] = [evaluate_check(CONTINUOUS, result({"static": {"tokens_per_s": 1.0},
                                                       "continuous": {"tokens_per_s": 2.0}}))]
    panel.set_result(r)
    assert panel.snapshot_data()["flag"] == ""


def test_prepare_compiles_ahead_on_a_spare_core_and_runs_that_chapter_last(monkeypatch):
    # the compilation chapter's torch.compile configuration compiles in a child process while the other
    # chapters run; its chapter runs last, waits for it and says in its conditions that its cache was warm
    import argparse
    import types

    from app.talk.compare import prepare, warm_compile
    from app.talk.presets import load_preset

    assert [c.label for c in warm_compile.compiled_configs(load_preset("compilation").compare)] == ["torch.compile"]
    assert warm_compile.compiled_configs(load_preset("streaming").compare) == []
    order, started, waited = [], [], []

    class Child:
        proc = types.SimpleNamespace(kill=lambda: waited.append("killed"))

        def wait(self):
            waited.append("waited")
            return True, 42.0, ""

    monkeypatch.setattr(prepare, "start", lambda name, *a: started.append(name) or Child())
    monkeypatch.setattr(prepare, "spare_cores", lambda threads: 1)
    monkeypatch.setattr("engine.loading.loader.load_model", lambda *a, **k: None)
    monkeypatch.setattr(prepare, "run_checked", lambda preset, run, conditions, say:
                        order.append((preset.name, conditions.get("compile_ahead"))) or {"checks": []})
    monkeypatch.setattr(prepare, "save_result", lambda *a: "stored")
    monkeypatch.setattr(prepare, "record_prepare", lambda *a: None)
    monkeypatch.setattr(prepare, "headline_text", lambda result: "")
    args = argparse.Namespace(preset=["compilation", "streaming", "speculative"], model="m", dtype="auto",
                              device="cpu", threads=1, json=None, background_compile=True)
    assert prepare.run_prepare(args) == 0
    assert started == ["compilation"] and waited == ["waited"]
    assert [name for name, _ in order] == ["streaming", "speculative", "compilation"]
    assert order[0][1] is None and "warm cache" in order[2][1] and "42 s" in order[2][1]
    order.clear()
    started.clear()
    args.background_compile = False  # --no-background-compile: the given order, compiled in its chapter
    assert prepare.run_prepare(args) == 0
    assert started == [] and [name for name, _ in order] == ["compilation", "streaming", "speculative"]
