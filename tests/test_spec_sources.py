"""Where speculative drafts come from (issue 12, point 9: untested before): a separate draft_model (its
own weights, the target's tokenizer) keeps greedy output exact and is really used (it disagrees with the
target sometimes, unlike a copy of it); a draft with another vocabulary is refused with the reason; MTP
heads saved where `inferlab train-mtp` saves them (the user cache dir) are found without mtp_heads."""
from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.spec.mtp import MtpHeads, heads_path, save_heads
from tests.conftest import build_tiny_model

PROMPTS = [[5, 17, 42, 99, 7, 250, 3, 64, 128, 11], [8, 9, 10, 8, 9, 10, 8, 9], list(range(20, 41))]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def make(folder, **kw):
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=256, block_size=4, **kw))


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return [o.token_ids for o in make(tiny_llama).generate(PROMPTS, GREEDY)]


def test_a_separate_draft_model(tiny_llama, tmp_path, plain):
    other = build_tiny_model(tmp_path / "draft", "llama", seed=7, num_hidden_layers=1)
    eng = make(tiny_llama, spec_method="draft", draft_model=str(other), num_speculative_tokens=3)
    assert eng.proposer.model.config.num_hidden_layers == 1  # the draft's own architecture, not the target's
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == plain
    st = eng.stats()
    assert st.num_draft_tokens > 0 and st.num_accepted_tokens < st.num_draft_tokens
    assert eng.block_manager.num_used_blocks == 0


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    other = build_tiny_model(tmp_path / "draft", "llama", vocab_size=400)
    with pytest.raises(ValueError, match="share a tokenizer"):
        make(tiny_llama, spec_method="draft", draft_model=str(other), num_speculative_tokens=2)


def test_mtp_heads_are_found_in_the_cache_dir(tiny_llama, tmp_path, monkeypatch, plain):
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="train-mtp"):
        make(tiny_llama, spec_method="mtp", num_speculative_tokens=2)
    torch.manual_seed(3)
    heads = MtpHeads(64, 2)
    for b in heads.blocks:
        torch.nn.init.normal_(b.weight, std=0.2)
    path = heads_path(str(tiny_llama))
    assert path.is_relative_to(tmp_path / "cache")
    path.parent.mkdir(parents=True)
    save_heads(heads, path, {"model": "tiny"})
    eng = make(tiny_llama, spec_method="mtp", num_speculative_tokens=2)  # no mtp_heads: found by the model path
    assert eng.proposer.name == "mtp"
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == plain
    assert eng.stats().num_draft_tokens > 0
