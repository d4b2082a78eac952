"""Batch invariance on the CPU in bf16 (EngineConfig.batch_invariant, engine/runner/fused.py accepts): a
greedy answer is the one its prompt gets alone, whatever shares its steps: batches of 8, 9, 32 and 64,
prompts cut into chunks, requests preempted and recomputed, a self-draft's verifies of 4 requests at once.
The model is a small random one whose logits often lie within rounding of each other (weights of std 0.3),
so a row summed in another order picks another token: with the option off (the library GEMM above 8 rows,
prompt rows through it) these runs differ from the solo ones."""
from __future__ import annotations

import random

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.runner.fused import PATH_FUSED

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory):
    import transformers

    from tests.conftest import build_tokenizer

    folder = tmp_path_factory.mktemp("sensitive")
    vocab = build_tokenizer(folder)
    conf = transformers.LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    max_position_embeddings=512, rms_norm_eps=1e-5, eos_token_id=2,
                                    bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(conf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
    model.save_pretrained(folder)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(3, 40))] for _ in range(64)]
    return folder, prompts


def _engine(folder, seqs: int, **kw) -> LLMEngine:
    kw.setdefault("num_kv_blocks", 512)
    return LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", max_num_seqs=seqs, num_threads=2, **kw))


@pytest.fixture(scope="module")
def solo(sensitive):
    folder, prompts = sensitive
    engine = _engine(folder, 1)
    return [engine.generate([p], PARAMS)[0].token_ids for p in prompts]


def _differ(out, solo) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(out, solo)) if a != b]


@pytest.mark.parametrize("seqs", [8, 9, 32, 64])
def test_a_batch_answers_as_its_prompts_do_alone(sensitive, solo, seqs):
    folder, prompts = sensitive
    engine = _engine(folder, seqs)
    out = [o.token_ids for o in engine.generate(prompts, PARAMS)]
    assert _differ(out, solo) == []
    assert engine.runner.last_path == PATH_FUSED


def test_chunked_and_preempted_requests_answer_as_alone(sensitive, solo):
    """Prompts cut into chunks of a few tokens that share steps with decodes, and a KV cache so small that
    requests are preempted and their tokens recomputed as prompt rows."""
    folder, prompts = sensitive
    engine = _engine(folder, 32, num_kv_blocks=40, block_size=4, max_num_batched_tokens=24)
    out = [o.token_ids for o in engine.generate(prompts[:32], PARAMS)]
    assert engine.stats().num_preemptions > 0
    assert _differ(out, solo[:32]) == []


def test_self_draft_speculation_in_a_batch_answers_as_alone(sensitive, solo):
    folder, prompts = sensitive
    engine = _engine(folder, 4, spec_method="draft", num_speculative_tokens=4)
    out = [o.token_ids for o in engine.generate(prompts[:16], PARAMS)]
    stats = engine.stats()
    assert stats.num_verify_passes > 0 and stats.num_accepted_tokens < stats.num_draft_tokens  # some rejected
    assert _differ(out, solo[:16]) == []


def test_prompt_rows_take_the_fused_step_only_when_invariant(sensitive):
    folder, prompts = sensitive
    for invariant in (True, False):
        engine = _engine(folder, 4, batch_invariant=invariant)
        engine.add_request(prompts[0], PARAMS)
        engine.step()  # the prompt's one step
        assert (engine.runner.last_path == PATH_FUSED) == invariant
