"""The sampler's greedy rows and finiteness check in one native pass (engine/kernels/sample_rows.cpp over
core/rows.h, ModelRunner.rows_kernel): torch's argmax (its first maximum) on every tier this CPU runs, -1 for
a row holding NaN or +-inf, the same SampleResult as the torch path, and an engine whose runner takes it
fails a poisoned request alone, as the torch path does."""
from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kernels import kernel_module
from engine.models.layers.sampler import sample
from tests.conftest import built_kernel, kernel_tiers
from tests.test_request_failure import PROMPTS, poison_logits, run

VOCAB_SIZES = [1, 63, 64, 65, 1000, 49152, 49155]


@pytest.mark.parametrize("tier", kernel_tiers())
def test_greedy_rows_are_torchs_argmax_and_fail_nonfinite_rows(tier):
    mod = built_kernel(kernel_module, tier)
    gen = torch.Generator().manual_seed(0)
    for vocab in VOCAB_SIZES:
        x = torch.randn(5, vocab, generator=gen)
        x[0, vocab // 3] = x[0, vocab - 1] = 9.0  # a tie: the first index, as torch.argmax
        x[1] = x[1].round()  # many ties at the top
        assert torch.equal(mod.greedy_rows(x), x.argmax(dim=-1)), vocab
        assert torch.equal(mod.greedy_rows(x[1:4]), x[1:4].argmax(dim=-1))  # a view: rows apart by the stride
        strided = torch.randn(3, 2 * vocab, generator=gen)[:, :vocab]
        assert torch.equal(mod.greedy_rows(strided), strided.argmax(dim=-1))
    x = torch.randn(6, 49152, generator=gen)
    x[1, 5], x[2, 100], x[3, 49151], x[4] = math.nan, math.inf, -math.inf, -math.inf  # (row 4: all -inf)
    x[5, 49150] = math.nan  # in the last block
    got = mod.greedy_rows(x)
    assert got[0] == x[0].argmax() and (got[1:] == -1).all()
    tail = torch.randn(2, 49155, generator=gen)
    tail[1, 49154] = math.inf  # in the tail after the last whole block of 64
    assert mod.greedy_rows(tail).tolist() == [int(tail[0].argmax()), -1]
    with pytest.raises(RuntimeError, match="float32"):
        mod.greedy_rows(x.double())
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.greedy_rows(x.t())


def _native():
    mod = kernel_module()
    if mod is None:
        pytest.skip("no C++ toolchain to build the kernels")
    return mod


@pytest.mark.parametrize("mix", ["greedy", "mixed", "logprobs"])
def test_sample_with_the_native_rows_gives_the_torch_paths_result(mix):
    mod = _native()
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 4096, generator=gen) * 3
    logits[2, 17] = math.nan
    logits[4, 99] = -math.inf
    greedy = SamplingParams(temperature=0.0, logprobs=3 if mix == "logprobs" else None)
    sampled = SamplingParams(temperature=0.9, top_k=50, seed=3)
    params = [greedy if mix != "mixed" or i % 2 else sampled for i in range(6)]

    def run(native):
        gens = [torch.Generator().manual_seed(i) for i in range(6)]
        extra = torch.tensor([7, 8, 9])
        return sample(logits.clone(), params, gens, extra=extra, native=native)

    want, got = run(None), run(mod)
    assert got.failed == want.failed == [2, 4]
    assert got.token_ids == want.token_ids and got.token_ids[2] is None and got.token_ids[4] is None
    assert got.extra == want.extra == [7, 8, 9]
    assert got.logprobs == want.logprobs
    if mix == "logprobs":
        assert got.logprobs[0] is not None and got.logprobs[2] is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_an_engine_on_the_native_rows_fails_a_poisoned_request_alone(tiny_llama_hd64, value):
    """bf16 on the CPU with the native decode attention (not the fused step: its own argmax): the runner
    samples with the native rows; one request's NaN / inf logits fail it alone, the others get the
    tokens the torch path gives them."""
    _native()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)

    def outputs(native_rows: bool):
        eng = LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                     fused_decode=False))
        assert eng.runner.rows_kernel is not None
        if not native_rows:
            eng.runner.rows_kernel = None
        poison_logits(eng, value)  # the second prompt's rows (its first token is POISON)
        done, _ = run(eng, params)
        assert eng.block_manager.num_used_blocks == 0
        return [done[i] for i in range(len(PROMPTS))]

    native, reference = outputs(True), outputs(False)
    assert [o.finish_reason for o in native] == [o.finish_reason for o in reference]
    assert [o.token_ids for o in native] == [o.token_ids for o in reference]
    assert native[1].finish_reason == "error" and "non-finite" in native[1].error
    assert all(o.finish_reason == "length" for i, o in enumerate(native) if i != 1)


def test_the_reference_path_and_the_portable_tier_keep_torchs_ops():
    from engine.models.layers.attention import AttentionBackend
    from engine.runner.model_runner import rows_kernel

    mod = _native()
    assert rows_kernel(AttentionBackend(native_decode=mod), None) is mod
    assert rows_kernel(AttentionBackend(native_decode=mod, reference=True), None) is None  # the readable path
    assert rows_kernel(AttentionBackend(), None) is None  # no native module runs: none is built for it

    class Portable:
        def greedy_rows(self, x):
            raise AssertionError("not called")

        def tier(self):
            return "portable"

    assert rows_kernel(AttentionBackend(native_decode=Portable()), None) is None
