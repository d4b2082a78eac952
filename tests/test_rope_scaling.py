"""RoPE scaling (issue 12, point 9: untested before): Llama 3's frequency-dependent scaling and linear
scaling give the logits Hugging Face transformers gives on the same weights and config (and differ from
the unscaled model, so the scaling really applies), and a GGUF's rope metadata (freq_base, a linear
scaling type and factor) reaches the converted config and the same logits."""
from __future__ import annotations

import json

import pytest
import torch

from engine import EngineConfig, LLMEngine
from tests.conftest import build_tiny_model
from tests.test_loader import write_llama_gguf
from tests.test_model_equivalence import PROMPT, hf_logits

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
LINEAR = {"rope_type": "linear", "factor": 4.0}


def score(folder) -> torch.Tensor:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=64)).score(PROMPT)


@pytest.fixture(scope="module")
def unscaled(tiny_llama):
    return score(tiny_llama)


@pytest.mark.parametrize("scaling", [LLAMA3, LINEAR], ids=["llama3", "linear"])
def test_rope_scaling_equals_transformers(tmp_path, unscaled, scaling):
    folder = build_tiny_model(tmp_path / "scaled", "llama", rope_scaling=dict(scaling), rope_theta=10000.0)
    saved = json.loads((folder / "config.json").read_text())
    assert (saved.get("rope_parameters") or saved.get("rope_scaling"))["rope_type"] == scaling["rope_type"]
    ours = score(folder)
    torch.testing.assert_close(ours, hf_logits(folder, PROMPT), atol=1e-4, rtol=1e-4)
    assert (ours - unscaled).abs().max() > 1e-2  # the same weights without scaling: other logits


def test_gguf_rope_metadata_reaches_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    folder = build_tiny_model(tmp_path / "hf", "llama", rope_scaling=dict(LINEAR), rope_theta=50000.0)
    gguf_path = write_llama_gguf(folder, tmp_path / "scaled.gguf", linear_rope_factor=LINEAR["factor"])
    eng = LLMEngine(EngineConfig(model=str(gguf_path), dtype="float32", num_kv_blocks=64))
    assert eng.model_config.rope_theta == 50000.0
    assert eng.model_config.rope_scaling["rope_type"] == "linear" and eng.model_config.rope_scaling["factor"] == 4.0
    torch.testing.assert_close(eng.score(PROMPT), hf_logits(folder, PROMPT), atol=1e-4, rtol=1e-4)


def test_the_rope_tables_are_gathered_once_a_step_not_once_a_layer(tiny_llama, tiny_llama_8_layers):
    """Each layer gathered and cast its own cos/sin rows (~6 ops x layers a step: launches on a GPU, where
    the first run found eager decoding launch-bound); now one gather a forward pass, and rotate-half is
    one roll. Counted on the CPU, in the eager layers ("fast" attention, float32)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from engine import SamplingParams

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    for layers, model in ((2, tiny_llama), (8, tiny_llama_8_layers)):
        eng = LLMEngine(EngineConfig(model=str(model), dtype="float32", attention_backend="fast", num_kv_blocks=32))
        eng.add_request("Hello there", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        for _ in range(3):
            eng.step()
        with Count() as count:
            eng.step()  # one decode step
        counts[layers] = count.ops
    gathers = [counts[n]["aten.index.Tensor"] for n in (2, 8)]
    assert gathers[0] == gathers[1]  # as many gathers with 8 layers as with 2
    assert counts[8]["aten.roll.default"] == 2 * 8 and counts[8]["aten.neg.default"] == 0
