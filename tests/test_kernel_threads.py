"""The native kernels built without OpenMP (as on macOS, whose Apple clang has none; engine/kernels/threads.h):
their own pool of threads splits the work as OpenMP's team does, so both builds give the same numbers at
any thread count; a build with OpenMP that fails falls back to one without; a child process after fork()
starts a pool of its own."""
from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams, kernels
from engine.kernels import build, load
from tests.conftest import build_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def builds():
    tier = kernels.cpu_tier()
    with_openmp = kernels.kernel_module(tier=tier)
    if with_openmp is None:
        pytest.skip("no C++ toolchain to build the kernels")
    before = os.environ.get(kernels.OPENMP_ENV)
    os.environ[kernels.OPENMP_ENV] = "0"
    try:
        without = kernels.kernel_module(tier=tier)
    finally:
        if before is None:
            os.environ.pop(kernels.OPENMP_ENV)
        else:
            os.environ[kernels.OPENMP_ENV] = before
    assert without is not None and without is not with_openmp
    return with_openmp, without


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_the_products_split_over_the_pool_give_openmps_numbers(builds, threads):
    with_openmp, without = builds
    assert with_openmp.openmp() and not without.openmp() and with_openmp.pool_threads() == 0
    torch.manual_seed(0)
    x, w = torch.randn(5, 576, dtype=torch.bfloat16), torch.randn(1536, 576, dtype=torch.bfloat16)
    bias = torch.randn(1536, dtype=torch.bfloat16)
    for count in (1, 2, 3):
        threads(count)
        for b in (None, bias):
            assert torch.equal(without.stream_linear_bf16(x, w, b), with_openmp.stream_linear_bf16(x, w, b))
    assert without.pool_threads() >= 2  # the 3-thread calls ran on two workers beside the caller
    with pytest.raises(RuntimeError, match="x \\(M, K\\) and W \\(N, K\\)"):  # bad operands fail alone
        without.stream_linear_bf16(x, w[:, :64], None)
    assert torch.equal(without.stream_linear_bf16(x, w, None), with_openmp.stream_linear_bf16(x, w, None))


@pytest.mark.parametrize("fused", [True, False], ids=["fused-step", "layers+native-attention"])
def test_an_engine_on_the_build_without_openmp_answers_as_on_openmps(builds, fused, tmp_path, monkeypatch):
    """Two threads: the fused step's one team (its barriers need every thread at once) or the layer path's
    products and paged attention, each over the pool; greedy tokens and log-probabilities bit for bit."""
    folder = build_tiny_model(tmp_path / "m", "llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    prompts = [[(5 * i + 3 * j) % 90 + 5 for j in range(3 + 4 * i)] for i in range(5)]
    params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=0, ignore_eos=True)
    answers = []
    for openmp in ("1", "0"):
        monkeypatch.setenv(kernels.OPENMP_ENV, openmp)
        eng = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", num_kv_blocks=64, block_size=4,
                                     num_threads=2, fused_decode=fused, attention_backend="native"))
        assert (eng.runner.fused is not None) == fused and eng.runner.native_decode is not None
        assert ("without OpenMP" in eng.compute_line()) == (openmp == "0")
        answers.append([(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in eng.generate(prompts, params)])
    assert answers[0] == answers[1]


def test_a_compiler_without_openmp_gets_the_build_without_it(builds, monkeypatch):
    """As on macOS: the build with -fopenmp fails, the one without is made; one warning says so, the
    engine line names it; a later start on this machine loads that build without trying again."""
    _, without = builds
    tier = kernels.cpu_tier()
    tried = []

    def compile_one(name, build_tier, openmp):
        tried.append(openmp)
        if openmp:
            raise RuntimeError("clang: error: unsupported option '-fopenmp'")
        return without

    monkeypatch.setattr(kernels, "_BUILT", {})
    monkeypatch.setattr(build, "FAILED", {})
    monkeypatch.setattr(build, "_load", compile_one)
    monkeypatch.setattr(load, "import_built", lambda name, locked=False: None)
    with pytest.warns(UserWarning, match="built without OpenMP.*unsupported option '-fopenmp'"):
        assert kernels.kernel_module(tier=tier) is without
    assert tried == [True, False]
    assert "built without OpenMP" in kernels.status(tier)

    monkeypatch.setattr(kernels, "_BUILT", {})
    monkeypatch.setattr(load, "import_built", lambda name, locked=False: without if "_noomp_" in name else None)
    assert kernels.kernel_module(tier=tier) is without and tried == [True, False]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_starts_a_pool_of_its_own(builds, threads):
    """The parent's pool has workers; a child after fork() has none of those threads: it must not wait on
    them (it would hang for ever) but start its own."""
    _, without = builds
    torch.manual_seed(1)
    x, w = torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(512, 256, dtype=torch.bfloat16)
    threads(2)
    expected = without.stream_linear_bf16(x, w, None)
    assert without.pool_threads() >= 1
    pid = os.fork()
    if pid == 0:  # the child: no pytest here, only an exit code
        code = 3
        try:
            torch.set_num_threads(2)
            code = 0 if torch.equal(without.stream_linear_bf16(x, w, None), expected) else 1
        finally:
            sys.stdout.flush()
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the child hung on its parent's pool")
