"""compile=True computes the eager layers' numbers: the compilation chapter's "same weights, same answers"."""
from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models.layers import attention_op


@pytest.mark.slow
def test_compiled_steps_give_the_eager_layers_tokens_and_logprobs_bit_for_bit(tiny_llama_hd64, monkeypatch):
    """Four bf16 requests batched together: their prompts (steps with prompt rows run eager) and their decodes
    (one compiled region per step). Greedy tokens AND log-probabilities equal the eager engine's exactly.
    Before: RMSNorm's float32 sum in another order, and the prompt GEMM folded with the residual add into one
    addmm, gave other bf16 roundings, so a prompt's K/V and then the answers parted."""
    attention_calls = []
    original = attention_op.attend_paged
    monkeypatch.setattr(attention_op, "attend_paged", lambda *a: attention_calls.append(1) or original(*a))
    eng = LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                 max_num_seqs=4, fused_decode=False))
    prompts = [[(7 * i + 3 * j) % 90 + 5 for j in range(10 + 3 * i)] for i in range(4)]
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0, ignore_eos=True)

    def run():
        outs = eng.generate(prompts, params)
        return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outs]

    eager = run()
    assert not attention_calls  # the eager layers call the attention directly
    eng.reconfigure(compile=True)
    compiled = run()
    assert eng.model.compiled and attention_calls  # decode steps ran in the compiled region (its attention op)
    assert compiled == eager


def test_the_compiled_attention_op_refuses_to_run_without_a_step():
    """The op reads the step's metadata beside the graph; called outside a forward pass it says so."""
    q = torch.zeros(1, 2, 4)
    cache = torch.zeros(1, 4, 4)
    with pytest.raises(RuntimeError, match="outside a forward pass"):
        attention_op.paged_attend(q, q[:, :1], q[:, :1], cache, cache.clone(), 0.5)
