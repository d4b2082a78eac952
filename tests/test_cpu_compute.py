"""dtype="auto" on the CPU: bf16 where the CPU has native bf16 dot products, else bf16 weights with
fp32 products for prefill (engine/runner/cpu_compute.py). The decision is a function of the CPU's
flags, tested here with fake flag sets; INFERLAB_EMULATED_BF16=1 runs the fp32 path on this machine."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kernels import cpu_flags
from engine.models.layers.linear import Linear
from engine.runner.cpu_compute import EMULATED_BF16_ENV, native_bf16_flags, plan_compute

CPU = torch.device("cpu")
ZEN3 = ["fpu", "sse2", "avx", "avx2", "fma", "f16c"]  # AVX2, no AVX-512: bf16 is emulated
ZEN4 = ZEN3 + ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"]
SAPPHIRE_RAPIDS = ZEN3 + ["avx512f", "amx_tile", "amx_bf16"]
GRAVITON3 = ["fp", "asimd", "asimddp", "sve", "bf16", "i8mm"]
GRAVITON2 = ["fp", "asimd", "asimddp"]
NO_ENV: dict[str, str] = {}
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [list(range(20, 61)), [5, 17, 42, 99, 7, 250, 3, 64, 128, 11, 300, 21]]


@pytest.mark.parametrize("flags", [ZEN4, SAPPHIRE_RAPIDS, GRAVITON3])
def test_auto_is_bf16_where_the_cpu_has_native_bf16(flags):
    plan = plan_compute("auto", CPU, flags, NO_ENV)
    assert (plan.dtype, plan.matmul_dtype, plan.widened) == (torch.bfloat16, torch.bfloat16, False)
    assert plan.describe().startswith("bf16: this CPU has native bf16 (")


@pytest.mark.parametrize("flags", [ZEN3, GRAVITON2, []])
def test_auto_keeps_bf16_weights_and_prefills_in_fp32_elsewhere(flags):
    plan = plan_compute("auto", CPU, flags, NO_ENV)
    assert (plan.dtype, plan.matmul_dtype, plan.widened) == (torch.bfloat16, torch.float32, True)
    assert plan.describe().startswith("bf16 weights, fp32 prefill: this CPU has no native bf16")


def test_the_environment_forces_the_emulated_decision_on_a_native_cpu():
    plan = plan_compute("auto", CPU, ZEN4, {EMULATED_BF16_ENV: "1"})
    assert plan.matmul_dtype == torch.float32
    assert f"{EMULATED_BF16_ENV}=1" in plan.describe()
    assert not plan_compute("auto", CPU, ZEN4, {EMULATED_BF16_ENV: "0"}).widened


def test_an_explicit_dtype_is_kept_and_its_cost_said():
    slow = plan_compute("bfloat16", CPU, ZEN3, NO_ENV)
    assert (slow.dtype, slow.widened) == (torch.bfloat16, False)
    assert "emulated bf16 (slow" in slow.describe()
    assert plan_compute("float32", CPU, ZEN3, NO_ENV).describe() == "fp32: asked for"
    with pytest.raises(ValueError, match="dtype must be"):
        plan_compute("int4", CPU, ZEN3, NO_ENV)


def test_flags_of_this_machine_are_read():
    flags = cpu_flags()
    assert isinstance(flags, frozenset) and all(isinstance(f, str) for f in flags)
    if flags:  # Linux: /proc/cpuinfo lists them; the decision follows them
        assert plan_compute("auto", CPU, None, NO_ENV).widened == (not native_bf16_flags(flags))


def test_a_widened_linear_computes_in_fp32_and_returns_bf16():
    torch.manual_seed(0)
    lin = Linear(64, 32, bias=True)
    lin.weight.data = torch.randn(32, 64).to(torch.bfloat16)
    lin.bias.data = torch.randn(32).to(torch.bfloat16)
    x = torch.randn(20, 64).to(torch.bfloat16)
    lin.matmul_dtype = torch.float32
    y = lin(x)
    exact = F.linear(x.float(), lin.weight.float(), lin.bias.float())
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, exact.to(torch.bfloat16))  # fp32 product, rounded once at the end


def _product_dtypes(monkeypatch) -> list[tuple[str, torch.dtype]]:
    """(what, dtype) of every library product with more than a few rows (prefill) and of every
    attention matmul from now on."""
    seen: list[tuple[str, torch.dtype]] = []
    real_linear, real_matmul = F.linear, torch.matmul

    def linear(x, weight, bias=None):
        if x.dim() == 2 and x.shape[0] > 8:
            seen.append(("linear", x.dtype))
        return real_linear(x, weight, bias)

    def matmul(a, b):
        seen.append(("attention", a.dtype))
        return real_matmul(a, b)

    monkeypatch.setattr(F, "linear", linear)
    monkeypatch.setattr(torch, "matmul", matmul)
    return seen


def test_forced_emulated_bf16_prefills_in_fp32_with_the_same_tokens(tiny_llama, monkeypatch):
    """Fails on the old code: it ignored the CPU and prefilled in bf16. (The widened GEMM path: on a tier
    whose kernel takes prompt rows, the next test.)"""
    monkeypatch.setattr("engine.models.layers.linear.PROMPT_STREAM_TIERS", ())
    native = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4))
    expected = [o.token_ids for o in native.generate(PROMPTS, GREEDY)]
    monkeypatch.setenv(EMULATED_BF16_ENV, "1")
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4))
    assert eng.dtype == torch.bfloat16 and eng.compute.widened
    assert eng.runner.backend.matmul_dtype == torch.float32
    assert "bf16 weights, fp32 prefill" in eng.compute.describe()
    seen = _product_dtypes(monkeypatch)
    got = [o.token_ids for o in eng.generate(PROMPTS, GREEDY)]
    assert {what for what, _ in seen} == {"linear", "attention"}
    assert {dtype for _, dtype in seen} == {torch.float32}
    assert got == expected


def test_emulated_bf16_on_the_avx2_body_streams_prompt_rows_whatever_their_chunking(tiny_llama, monkeypatch):
    """Where bf16 is emulated and the kernels run the AVX2 body, prompt rows go through the weight-streaming
    kernel too (no weight widened per call), and since each row's result there is its result alone, a
    chunked prefill and a prefix-cache hit give the unchunked run's tokens."""
    from engine.kernels import supported_tiers
    from engine.models.layers import linear as linear_mod
    from tests.conftest import has_toolchain

    if "avx2" not in supported_tiers() or not has_toolchain():
        pytest.skip("needs a CPU with AVX2 and a C++ toolchain")
    native = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4))
    expected = [o.token_ids for o in native.generate(PROMPTS, GREEDY)]
    monkeypatch.setenv(EMULATED_BF16_ENV, "1")
    monkeypatch.setenv("INFERLAB_CPU_TIER", "avx2")
    widened = []
    real = linear_mod.widened_linear
    monkeypatch.setattr(linear_mod, "widened_linear", lambda x, *a: widened.append(x.shape[0]) or real(x, *a))
    whole = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4))
    streams = {m.stream.tier() for m in whole.runner.model.modules() if isinstance(m, Linear) and m.stream}
    assert whole.compute.widened and streams == {"avx2"}
    got = [o.token_ids for o in whole.generate(PROMPTS, GREEDY)]
    again = [o.token_ids for o in whole.generate(PROMPTS, GREEDY)]  # the prompts' blocks from the prefix cache
    chunked = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4,
                                     enable_chunked_prefill=True, max_num_batched_tokens=8))
    in_chunks = [o.token_ids for o in chunked.generate(PROMPTS, GREEDY)]
    assert widened == []
    assert got == again == in_chunks
    assert got == expected  # and the tokens of the native bf16 engine on this tiny model


def test_without_native_kernels_an_emulating_cpu_runs_an_fp32_model(tiny_llama, monkeypatch):
    """Decode on torch's kernels would widen every weight per token: an fp32 model reads less."""
    assert plan_compute("auto", CPU, ZEN4, NO_ENV).without_native_kernels().dtype == torch.bfloat16
    monkeypatch.setenv(EMULATED_BF16_ENV, "1")
    monkeypatch.setattr("engine.llm_engine.stream_kernel_for", lambda *a, **k: None)  # no compiler
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4))
    assert (eng.dtype, eng.compute.widened) == (torch.float32, False)
    assert eng.compute.describe().startswith("fp32: ")
    assert eng.compute.describe().endswith("the native decode kernels are not available")
    assert eng.generate(PROMPTS[:1], GREEDY)[0].token_ids
