"""compile=True computes the eager layers' numbers: the compilation chapter's "same weights, same answers"."""
from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kernels import cpu_flags
from engine.models.layers import attention_op


@pytest.mark.slow
def test_compiled_steps_give_the_eager_layers_tokens_and_logprobs_bit_for_bit(tiny_llama_hd64, monkeypatch):
    """bf16 requests batched together: their prompts (steps with prompt rows run eager) and their decodes (one
    compiled region per step; ten rows at once take the library GEMM, four the streaming kernel), then a lone
    prompt of 5 tokens. Greedy tokens AND log-probabilities equal the eager engine's exactly. Before: the
    prompt GEMM folded with the residual add into one addmm rounded once, and a short prompt took the
    streaming kernel inside a compiled region (eager gives prompt rows the GEMM), so K/V and answers parted."""
    attention_calls = []
    original = attention_op.attend_paged
    monkeypatch.setattr(attention_op, "attend_paged", lambda *a: attention_calls.append(1) or original(*a))
    eng = LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=128, block_size=4,
                                 max_num_seqs=12, fused_decode=False))
    prompts = [[(7 * i + 3 * j) % 90 + 5 for j in range(4 + 3 * i)] for i in range(10)]
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0, ignore_eos=True)

    def run():
        outs = eng.generate(prompts, params) + eng.generate([[11, 40, 23, 9, 71]], params)
        return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outs]

    eager = run()
    assert not attention_calls  # the eager layers call the attention directly
    eng.reconfigure(compile=True)
    compiled = run()
    assert eng.model.compiled and attention_calls  # decode steps ran in the compiled region (its attention op)
    assert compiled == eager


@pytest.mark.slow
def test_a_compiled_rmsnorm_rounds_as_the_eager_one():
    """RMSNorm sums its squares in float64, exact whatever the order: compiled (a fused reduction) and eager
    give the same bf16 rows. With a float32 sum 4 of these 4096 rows of 576 differed after rounding."""
    from engine.models.layers.norm import RMSNorm
    from engine.models.llama import compile_like_eager

    torch.manual_seed(0)
    norm = RMSNorm(576, 1e-5)
    x = (torch.randn(4096, 576) * torch.rand(4096, 1) * 3).bfloat16()
    x[:, 7] *= 30  # an outlier channel, as real hidden states have
    with torch.inference_mode():
        assert torch.equal(compile_like_eager(norm.forward)(x), norm(x))


def test_the_compiled_attention_op_refuses_to_run_without_a_step():
    """The op reads the step's metadata beside the graph; called outside a forward pass it says so."""
    q = torch.zeros(1, 2, 4)
    cache = torch.zeros(1, 4, 4)
    with pytest.raises(RuntimeError, match="outside a forward pass"):
        attention_op.paged_attend(q, q[:, :1], q[:, :1], cache, cache.clone(), 0.5)


@pytest.mark.slow
def test_one_compiled_graph_serves_one_to_eight_rows(tiny_llama_hd64):
    """Decode steps of 3, 2 and 1 rows, then 1 again, run one compiled graph: the row count stays a symbol
    (1 row is not specialised apart, a second compile as long as the first) and the norms' eps are constants
    (traced as symbols they restarted the whole trace). Each compile cost ~half a minute on SmolLM2-135M."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    eng = LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=128, block_size=4,
                                 max_num_seqs=4, fused_decode=False, compile=True))
    if eng.model.lm_head.stream is None:
        pytest.skip("no native kernel here: one row takes the compiled gemv, a graph of its own")
    torch._dynamo.reset()
    counters.clear()
    restarts = len(compilation_time_metrics.get("compile_attempt_1", []))
    prompts = [[(5 * i + j) % 90 + 5 for j in range(6)] for i in range(3)]
    outs = eng.generate(prompts, [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (3, 6, 9)])
    outs += eng.generate([[11, 40, 23]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [3, 6, 9, 4]
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert len(compilation_time_metrics.get("compile_attempt_1", [])) == restarts  # no trace restarted


def test_a_forced_isa_gets_its_own_inductor_cache(monkeypatch, tmp_path):
    """ATEN_CPU_CAPABILITY set: inductor's default folder (unset, or written back by inductor itself) gets
    the ISA's name appended, sanitised; a folder the user chose, or no forced ISA, is left alone."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from engine.models.layers.inductor_cache import inductor_cache_per_isa

    default = os.path.abspath(default_cache_dir())
    for before in (None, default):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2/../x")
        if before is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", before)
        inductor_cache_per_isa()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default + "-avx2x"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    inductor_cache_per_isa()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)
    inductor_cache_per_isa()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default


_COMPILE_ONE = """
import torch
from engine.models.llama import compile_like_eager
def f(x, w):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    return y.to(torch.bfloat16) * w + x
torch.manual_seed(0)
x, w = torch.randn(5, 576, dtype=torch.bfloat16), torch.randn(576, dtype=torch.bfloat16)
print("same" if torch.equal(compile_like_eager(f)(x, w), f(x, w)) else "differs")
"""


@pytest.mark.slow
@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx2"} <= cpu_flags(), reason="needs a CPU with AVX-512 and AVX2")
def test_a_graph_compiled_at_avx512_is_not_served_to_an_avx2_run(tmp_path):
    """The same region compiled at AVX-512, then (a new process, the same default folder) as AVX2: the
    second gives eager's numbers. Before: it was served the AVX-512 graph from the shared cache and
    rebuilt it against 16-lane vectors (the whole test suite as AVX2 answered NaN in compiled decodes)."""
    root = Path(__file__).resolve().parent.parent
    for capability in ("avx512", "avx2"):
        env = {**os.environ, "TMPDIR": str(tmp_path), "ATEN_CPU_CAPABILITY": capability}
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        done = subprocess.run([sys.executable, "-c", _COMPILE_ONE], cwd=root, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-1] == "same", (capability, done.stdout)
    # a plain torch.compile in a process that imported the layers (tests/test_stream_linear.py compiles so)
    # (without eager's roundings: close, not equal; the stale graph was off by whole units)
    plain = _COMPILE_ONE.replace("from engine.models.llama import compile_like_eager",
                                 "import engine.models.layers\ncompile_like_eager = torch.compile").replace(
        "torch.equal(compile_like_eager(f)(x, w), f(x, w))",
        "torch.allclose(compile_like_eager(f)(x, w).float(), f(x, w).float(), rtol=2e-2, atol=2e-2)")
    for capability in ("avx512", "avx2"):
        env = {**os.environ, "TMPDIR": str(tmp_path / "plain"), "ATEN_CPU_CAPABILITY": capability}
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        (tmp_path / "plain").mkdir(exist_ok=True)
        done = subprocess.run([sys.executable, "-c", plain], cwd=root, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0 and done.stdout.split()[-1] == "same", (capability, done.stderr[-2000:])
    names = {p.name for p in tmp_path.iterdir()}
    assert {f"torchinductor_{getpass.getuser()}-avx2", f"torchinductor_{getpass.getuser()}-avx512"} <= names
