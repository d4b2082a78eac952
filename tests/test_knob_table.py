"""One knob table (engine/knobs.py): EngineConfig's defaults and checks, reconfigure's, and the app's
presets, cues, sliders and comparisons all read it; EngineConfig holds its SchedulerConfig."""
from __future__ import annotations

import dataclasses

import pytest

from engine import EngineConfig
from engine.config import SchedulerConfig
from engine.core.policies import POLICIES
from engine.knobs import KNOB, KNOBS, RECONFIGURABLE
from engine.quant_formats import QUANT_BITS, quant_format
from engine.validation import check_reconfigure


def test_engine_config_defaults_are_the_tables():
    config = EngineConfig()
    for knob in KNOBS:
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
    ({"max_num_seqs": 0}, "max_num_seqs"), ({"quant_bits": 3}, "quant_bits"), ({"dtype": "fp8"}, "dtype"),
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
        check_reconfigure(config, {"quant_bits": 8})  # a build-time knob


def test_policy_choices_are_the_policies_there_are():
    assert set(KNOB["policy"].choices) == set(POLICIES)


def test_app_range_is_narrower_for_presets_only():
    knob = KNOB["max_num_seqs"]
    assert knob.problem(1000) is None and knob.problem(1000, app=True) == "expected an integer in [1, 256]"
    assert knob.problem(True) and knob.problem("many", app=True)  # booleans are no integers


def test_quant_formats_registry():
    assert QUANT_BITS == (16, 8, 4) and KNOB["quant_bits"].choices == QUANT_BITS
    assert quant_format(16).dense and quant_format(4).grouped and not quant_format(8).grouped
    with pytest.raises(ValueError, match="bits must be 16, 8 or 4"):
        quant_format(3)
