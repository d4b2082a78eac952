"""A stored comparison or tradeoff sweep that lies (edited, damaged, or written by another version into
another shape): it counts as none stored (`malformed` in app/talk/compare/store.py and
app/tradeoff/sweep_store.py), so the panels never meet a field of the wrong kind. Before, such a comparison
raised in the panel while a preset was being applied (the preset stayed half applied), and such a sweep
raised in the tradeoff panel on every frame."""
from __future__ import annotations

import copy
import json
import random

from app.talk.compare.store import load_stored, malformed, result_path, save_result
from tests.widgets.test_comparison import MACHINE, _result
from widgets.comparison import EMPTY_TEXT, ComparisonPanel

JUNK = [None, "x", 0, -1, 1e308, float("nan"), float("inf"), [], {}, [1, 2], {"a": 1}, True, "12", 10**30]


def _bases() -> list[dict]:
    curve = [{"label": f"max_num_seqs={b}", "config": {"mode": "continuous", "max_num_seqs": b},
              "metrics": {"tokens_per_s": 10.0 * b, "per_user_tokens_per_s": 30.0 / b}} for b in (1, 2, 4, 8)]
    split = [{"label": f"rate {r}", "config": {"rate": r}, "metrics": {"goodput_rps": r / 2},
              "requests": [{"id": f"c{r}-{j}", "queue_ms": 10.0 * j, "prefill_ms": 50.0, "decode_ms": 300.0}
                           for j in range(3)]} for r in (1, 2, 4)]
    checks = [{"claim": "continuous is faster", "metric": "tokens_per_s", "expect": "higher", "holds": False,
               "figures": "10 vs 31"}]
    return [_result(), _result(knob="max_num_seqs", metrics=["tokens_per_s", "per_user_tokens_per_s"],
                               chart=["tokens_per_s", "per_user_tokens_per_s"], comparison=curve),
            _result(knob="rate", metrics=["goodput_rps"], chart=["goodput_rps"], comparison=split, rounds=3),
            _result(checks=checks, check_reasons=["a busy machine"],
                    fallback={"reason": "retried at 2 threads", "first_try": checks})]


def _mutate(o, rng: random.Random):
    if isinstance(o, (dict, list)) and o:
        key = rng.choice(list(o)) if isinstance(o, dict) else rng.randrange(len(o))
        r = rng.random()
        if r < 0.3:
            o[key] = rng.choice(JUNK)
        elif r < 0.42:
            del o[key]
        else:
            o[key] = _mutate(o[key], rng)
        return o
    return rng.choice(JUNK)


def test_the_results_the_app_writes_are_well_formed():
    assert all(malformed(r) is None for r in _bases())
    assert malformed({"title": "t", "not_built": "not built yet", "comparison": []}) is None


def test_a_lying_file_is_no_stored_result(tmp_path):
    good = _result(fingerprint="f")
    path = save_result("chapter", "m", good, root=tmp_path)
    assert load_stored("chapter", "m", MACHINE, fingerprint="f", root=tmp_path)["comparison"]
    assert result_path("chapter", "m", MACHINE, tmp_path) == path
    for lie in ({"comparison": [{"label": "a", "metrics": {"tokens_per_s": "fast"}}]},
                {"comparison": [{"label": 7, "metrics": {}}]}, {"comparison": "all of them"},
                {"machine": ["cpu"]}, {"checks": [{"holds": "yes"}]}, {"chart": [None]}):
        path.write_text(json.dumps({**good, **lie}))
        assert load_stored("chapter", "m", MACHINE, fingerprint="f", root=tmp_path) is None, lie
    path.write_text('{"comparison": [{"label": "a", "metrics": {"x": NaN}}], "fingerprint": "f"}')
    assert load_stored("chapter", "m", MACHINE, fingerprint="f", root=tmp_path) is None


def test_whatever_passes_the_check_the_panel_shows(show):
    """Seeded fuzzing: results with fields replaced, removed or made junk at any depth. Each is either
    refused by the check or shown without an exception (over 2,000 mutations of real stored results passed
    this when it was written)."""
    panel = show(ComparisonPanel(), 1280, 720)
    rng, shown = random.Random(24), 0
    bases = _bases()
    for _ in range(600):
        result = copy.deepcopy(rng.choice(bases))
        for _ in range(1 + rng.randrange(3)):
            result = _mutate(result, rng)
        if not isinstance(result, dict) or "comparison" not in result or malformed(result):
            continue
        panel.set_result(result)
        shown += 1
    assert shown > 50  # the fuzzing reached the panel
    panel.set_result(None)
    assert panel.provenance.text() == EMPTY_TEXT



def test_a_lying_sweep_is_no_stored_sweep_and_whatever_passes_the_panel_shows(show, tmp_path):
    """The same for the tradeoff explorer's stored sweep (app/tradeoff/sweep_store.py): junk in its points
    raised in the tradeoff panel on every frame."""
    from test_tradeoff import _sweep

    from app.tradeoff import sweep_store
    from widgets.tradeoff import TradeoffPanel

    base = _sweep()
    assert sweep_store.malformed(base) is None
    better = {**base, "points": [{**base["points"][0], "ppl_delta_pct": -1.5}]}  # requantized onto its grid
    assert sweep_store.malformed(better) is None
    sweep_store.save(base, "m", "model", tmp_path)
    assert sweep_store.load("m", "model", tmp_path)["points"]
    for lie in ({"points": [{**base["points"][0], "max_num_seqs": "8"}]}, {"points": "many"},
                {"points": [{**base["points"][0], "quant_format": 8}]},  # a bit count names no format
                {"points": [{**{k: v for k, v in base["points"][0].items() if k != "quant_format"}, "bits": 8}]},
                {"frontier": [{"max_num_seqs": 1}]}, {"predicted": [{**base["predicted"][0], "model": None}]},
                {"points": [{**base["points"][0], "tokens_per_s_total": float("inf")}]}):
        sweep_store.save({**base, **lie}, "m", "model", tmp_path)
        assert sweep_store.load("m", "model", tmp_path) is None, lie
    panel = show(TradeoffPanel(), 700, 500)
    rng, shown = random.Random(7), 0
    for _ in range(600):
        result = _mutate(copy.deepcopy(base), rng)
        if not isinstance(result, dict) or sweep_store.malformed(result):
            continue
        panel.set_sweep(result)
        panel.flush()
        shown += 1
    assert shown > 50
