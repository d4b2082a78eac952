"""A config.json that asks for the absurd (issue 48, point 3): 100,000 layers grew to 2.8 GB building them,
a max_position_embeddings of 2^62 ended in a traceback, a rope_theta of -1 built a model that answers NaN.
Counts, sizes and constants are checked for type and range, and against the weight files' headers, before
any weight is read or any layer built: one ModelLoadError line naming config.json and the key."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from engine.loading import loader
from engine.loading.errors import ModelLoadError
from engine.loading.loader import load_model

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.fixture
def folder(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "model"
    shutil.copytree(tiny_llama, out)
    return out


def with_config(folder, **change):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))


def no_weight_read(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a weight file was read before the config was checked")
    monkeypatch.setattr(loader, "load_file", refuse)


@pytest.mark.parametrize("change,says", [
    ({"num_hidden_layers": 100_000}, "num_hidden_layers is 100000: a whole number from 1 to 1,024"),
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0"),
    ({"num_hidden_layers": True}, "num_hidden_layers is True"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers is 2.0"),
    ({"max_position_embeddings": 2**62}, "max_position_embeddings is 4611686018427387904"),
    ({"max_position_embeddings": -5}, "max_position_embeddings is -5"),
    ({"vocab_size": 10**30}, "vocab_size is 1000000000000000000000000000000"),
    ({"hidden_size": "64"}, "hidden_size is 64"),
    ({"num_attention_heads": 0}, "num_attention_heads is 0"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"head_dim": 7}, "head_dim is 7: RoPE rotates pairs"),
    ({"rope_theta": -1}, "rope_theta is -1: a finite number above 0"),
    ({"rope_theta": None, "rope_parameters": {"rope_theta": 0, "rope_type": "default"}}, "rope_theta is 0"),
    ({"rope_theta": None, "rope_parameters": {"rope_theta": -2.5, "rope_type": "default"}}, "rope_theta is -2.5"),
    ({"rope_theta": 10**400}, "rope_theta is 1000"),
    ({"rope_theta": "big"}, "rope_theta is big"),
    ({"rms_norm_eps": math.nan}, "rms_norm_eps is nan"),
    ({"rms_norm_eps": 5.0}, "rms_norm_eps is 5.0: a finite number above 0 and below 1"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor is 0"),
    ({"rope_scaling": {**LLAMA3, "high_freq_factor": 1.0}}, "high_freq_factor 1.0 is not above low_freq_factor"),
    ({"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 2**40}},
     "original_max_position_embeddings is 1099511627776"),
    ({"rope_scaling": [1, 2]}, "rope_scaling is [1, 2]: an object was expected"),
])
def test_a_config_out_of_range_is_one_line_naming_the_key_before_any_weight_is_read(folder, monkeypatch, change,
                                                                                      says):
    with_config(folder, **change)
    no_weight_read(monkeypatch)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder))
    assert str(err.value).startswith(f"{folder / 'config.json'}: ") and says in str(err.value), str(err.value)
    assert len(str(err.value)) < 300


def test_more_layers_than_the_weights_hold_fails_before_any_layer_is_built(folder, monkeypatch):
    with_config(folder, num_hidden_layers=1000)
    no_weight_read(monkeypatch)
    with pytest.raises(ModelLoadError, match=r"num_hidden_layers is 1,000 but the weights hold 2 layers "
                                             r"\(none numbered 2\)") as err:
        load_model(str(folder))
    assert str(folder / "config.json") in str(err.value)


def test_shapes_are_checked_from_the_headers_before_any_weight_is_read(folder, monkeypatch):
    with_config(folder, intermediate_size=96)
    no_weight_read(monkeypatch)
    with pytest.raises(ModelLoadError, match="has shape .* but config.json implies") as err:
        load_model(str(folder))
    assert str(folder / "model.safetensors") in str(err.value)


def test_a_config_in_range_still_loads(folder):
    with_config(folder, rope_scaling=LLAMA3, max_position_embeddings=2**21, rope_theta=500000.0)
    loaded = load_model(str(folder))
    assert loaded.config.num_hidden_layers == 2 and loaded.config.rope_theta == 500000.0
