"""One knob table (engine/knobs.py): EngineConfig's defaults and checks, reconfigure's, and the app's
presets, cues, sliders and comparisons all read it; EngineConfig holds its SchedulerConfig."""
from __future__ import annotations

import dataclasses
import typing

import pytest

from engine import EngineConfig
from engine.config import SchedulerConfig
from engine.core.policies import POLICIES
from engine.knobs import ENGINE_KNOBS, KNOB, KNOBS, RECONFIGURABLE, Box, KnobValues, Layer, Use, knobs_for, slider_knobs
from engine.quant_formats import QUANT_FORMAT_NAMES, quant_format
from engine.validation import check_reconfigure


def test_engine_config_defaults_are_the_tables():
    config = EngineConfig()
    for knob in ENGINE_KNOBS:
        assert getattr(config, knob.name) == knob.default, knob.name
        assert knob.problem(knob.default) is None, knob.name  # every default passes its own check


def test_engine_config_holds_its_scheduler_config_and_keeps_the_flat_constructor():
    config = EngineConfig(max_num_seqs=3, policy="spf", max_loras=2)
    assert config.scheduler == SchedulerConfig(max_num_seqs=3, policy="spf", max_loras=2)
    assert SchedulerConfig.of(config) is config.scheduler  # held, not copied
    assert (config.max_num_seqs, config.policy, config.max_loras) == (3, "spf", 2)
    changed = dataclasses.replace(config, max_num_batched_tokens=64)  # how reconfigure builds the new config
    assert changed.scheduler == SchedulerConfig(3, 64, True, "spf", 2) and config.max_num_batched_tokens == 512
    config.max_num_seqs = 5  # written through to a new (frozen) SchedulerConfig
    assert config.scheduler.max_num_seqs == 5
    assert config.knob_values()["max_num_seqs"] == 5 and "scheduler" not in config.knob_values()


@pytest.mark.parametrize("kwargs, name", [
    ({"max_num_seqs": 0}, "max_num_seqs"), ({"quant_format": "int3"}, "quant_format"), ({"dtype": "fp8"}, "dtype"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"), ({"policy": "lifo"}, "policy"),
    ({"num_speculative_tokens": 9}, "num_speculative_tokens"), ({"max_cpu_loras": -1}, "max_cpu_loras"),
])
def test_a_bad_value_names_its_knob(kwargs, name):
    with pytest.raises(ValueError, match=name):
        EngineConfig(**kwargs)


def test_reconfigure_validates_against_the_same_table():
    assert set(RECONFIGURABLE) == {k.name for k in KNOBS if k.run_time}
    config = EngineConfig()
    assert check_reconfigure(config, {"max_num_seqs": 4, "spec_method": "none"})["max_num_seqs"] == 4
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        check_reconfigure(config, {"max_num_batched_tokens": 0})
    with pytest.raises(ValueError, match="at run time"):
        check_reconfigure(config, {"quant_format": "int8"})  # a build-time knob


def test_policy_choices_are_the_policies_there_are():
    assert set(KNOB["policy"].choices) == set(POLICIES)


def test_app_range_is_narrower_for_presets_only():
    knob = KNOB["max_num_seqs"]
    assert knob.problem(1000) is None and knob.problem(1000, app=True) == "expected an integer in [1, 256]"
    assert knob.problem(True) and knob.problem("many", app=True)  # booleans are no integers


def test_quant_formats_are_named_and_two_share_a_width():
    assert QUANT_FORMAT_NAMES == ("bf16", "int8", "fp8-e4m3", "int4")
    assert KNOB["quant_format"].choices == QUANT_FORMAT_NAMES
    assert quant_format("bf16").dense and quant_format("int4").grouped and not quant_format("int8").grouped
    assert quant_format("int8").bits == quant_format("fp8-e4m3").bits == 8  # one width, two formats: the name keys
    with pytest.raises(ValueError, match="quant_format must be one of bf16, int8, fp8-e4m3, int4, got 8"):
        quant_format(8)  # a bit count selects nothing
    assert KNOB["quant_format"].stops == QUANT_FORMAT_NAMES  # the slider is a format slider


def test_every_row_says_how_the_app_shows_and_offers_it():
    for row in KNOBS:
        assert row.label, row.name
        assert isinstance(row.layer, Layer) and all(isinstance(u, Use) for u in row.uses), row.name
        if row.slider is not None:  # a slider: its stops are values the row takes, and it explains itself
            assert row.stops and row.help, row.name
            assert all(row.problem(v) is None for v in row.stops), row.name
        if row.flag is not None:
            assert row.flag.startswith("--") and row.help and ({Use.SERVE, Use.GENERATE} & row.uses), row.name
        if {Use.SERVE, Use.GENERATE} & row.uses:
            assert row.flag, row.name
    assert len({r.flag for r in KNOBS if r.flag}) == len([r for r in KNOBS if r.flag])  # no flag twice
    config = EngineConfig()
    assert all(hasattr(config, r.name) for r in ENGINE_KNOBS)  # every engine row is an EngineConfig field


def test_a_row_shows_its_values_in_words():
    assert KNOB["max_num_batched_tokens"].text(512) == "512 tok"
    assert KNOB["num_speculative_tokens"].text(0) == "off" and KNOB["num_speculative_tokens"].text(4) == "4 tokens"
    assert KNOB["arrival_rate"].text(1.5) == "1.5 req/s" and KNOB["kv_cache_dtype"].text("int8") == "int8 + row scales"
    assert KNOB["quant_format"].text("fp8-e4m3") == "fp8 e4m3" and KNOB["compile"].text(True) == "on"


def test_the_panel_boxes_and_the_uses_are_read_off_the_rows():
    assert [r.name for r in slider_knobs(Box.ENGINE)] == ["max_num_seqs", "max_num_batched_tokens",
                                                         "num_speculative_tokens", "kv_cache_dtype", "quant_format"]
    assert [r.name for r in slider_knobs(Box.LOAD)] == ["arrival_rate"]
    assert all(r.layer == Layer.LOAD for r in knobs_for(Use.PRESET, Layer.LOAD))
    assert {r.name for r in knobs_for(Use.RESTART)} == {"max_num_seqs", "quant_format", "num_speculative_tokens"}


def test_knob_values_is_keyed_and_typed_by_the_table():
    """KnobValues (the GUI's typed mapping) names every row with the row's type: the type checker holds the
    app's knob dicts to the table."""
    hints = typing.get_type_hints(KnobValues)
    assert set(hints) == set(KNOB)
    for name, hint in hints.items():
        row = KNOB[name]
        allowed = set(typing.get_args(hint)) or {hint}
        assert row.type in allowed and ((type(None) in allowed) == row.optional), name
