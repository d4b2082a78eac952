"""The native paged-decode kernel (engine/kernels/paged_decode.cpp) against plain float32 attention,
and the engine running it. The kernel is built once per machine (~25 s, cached by torch)."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import paged_decode_kernel
from tests.conftest import built_kernel, kernel_tiers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=kernel_tiers())
def kernel(request):
    """The build of each ISA tier this CPU runs (AVX-512, AVX2, plain C++ on an AVX-512 machine)."""
    return built_kernel(paged_decode_kernel, request.param)


def reference(qd, k_cache, v_cache, tables, lens, bs):
    """float32, one sequence and one KV head at a time, K/V gathered slot by slot."""
    n, kv_heads, group, d = qd.shape
    out = torch.empty(n, kv_heads, group, d)
    for s in range(n):
        slots = [tables[s][t // bs] * bs + t % bs for t in range(int(lens[s]))]
        for h in range(kv_heads):
            k, v = k_cache[h, slots].float(), v_cache[h, slots].float()  # (ctx, d)
            p = (qd[s, h].float() @ k.T).softmax(-1)  # (group, ctx)
            out[s, h] = p @ v
    return out


@pytest.mark.parametrize("bs, d, group", [(16, 64, 3), (4, 128, 2), (16, 64, 8)])
def test_kernel_matches_float32_attention(kernel, bs, d, group):
    g = torch.Generator().manual_seed(bs + d + group)
    kv_heads, num_blocks = 2, 64
    k_cache = torch.randn(kv_heads, num_blocks * bs, d, generator=g).bfloat16()
    v_cache = torch.randn(kv_heads, num_blocks * bs, d, generator=g).bfloat16()
    lens = torch.tensor([1, bs, bs + 1, 5 * bs - 3, 7])  # a lone token, whole blocks, ragged tails
    max_blocks = int(-(-lens.max() // bs))
    perm = torch.randperm(num_blocks, generator=g)
    tables = [perm[i * max_blocks:(i + 1) * max_blocks].tolist() for i in range(len(lens))]  # scattered blocks
    qd = (torch.randn(len(lens), kv_heads, group, d, generator=g) * d**-0.5).bfloat16()
    out = kernel.paged_decode(qd, k_cache, v_cache, torch.tensor(tables), lens, bs)
    assert out.dtype == torch.bfloat16 and out.shape == qd.shape
    torch.testing.assert_close(out.float(), reference(qd, k_cache, v_cache, tables, lens, bs),
                               rtol=1e-2, atol=4e-3)  # one bf16 rounding of the output


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_kernel_splits_work_by_context_length(kernel, threads):
    """A batch of short chats with a few long documents at the end (the mixed workload's shape): the
    threads get runs of jobs with equal total context, and every job is computed exactly once."""
    g = torch.Generator().manual_seed(threads)
    bs, d, group, kv_heads = 16, 64, 3, 3
    lens = torch.tensor([1, 15, 16, 17, 33, 2, 40, 9, 300, 511, 17, 257])
    max_blocks = int(-(-lens.max() // bs))
    num_blocks = len(lens) * max_blocks
    k_cache = torch.randn(kv_heads, num_blocks * bs, d, generator=g).bfloat16()
    v_cache = torch.randn(kv_heads, num_blocks * bs, d, generator=g).bfloat16()
    perm = torch.randperm(num_blocks, generator=g)
    tables = [perm[i * max_blocks:(i + 1) * max_blocks].tolist() for i in range(len(lens))]
    qd = (torch.randn(len(lens), kv_heads, group, d, generator=g) * 2 * d**-0.5).bfloat16()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = kernel.paged_decode(qd, k_cache, v_cache, torch.tensor(tables), lens, bs)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.float(), reference(qd, k_cache, v_cache, tables, lens, bs), rtol=1e-2, atol=4e-3)


def test_kernel_runs_without_the_gil(kernel):
    """While one thread runs the kernel back to back, another still runs Python (the app's GUI thread)."""
    import threading
    import time

    bs, n, blocks_per_seq = 16, 8, 64
    cache = torch.randn(2, n * blocks_per_seq * bs, 64).bfloat16()
    qd = torch.randn(n, 2, 2, 64).bfloat16()
    tables = torch.arange(n * blocks_per_seq).view(n, blocks_per_seq)
    lens = torch.full((n,), blocks_per_seq * bs)
    calls, stop = [], time.perf_counter() + 1.0

    def work():
        while time.perf_counter() < stop:
            kernel.paged_decode(qd, cache, cache, tables, lens, bs)
            calls.append(1)

    worker = threading.Thread(target=work)
    worker.start()
    ticks = 0
    while worker.is_alive():
        ticks += 1
        time.sleep(0.001)
    worker.join()
    assert len(calls) > 10 and ticks > 100  # holding the GIL, the main thread got no tick in a second


def test_kernel_refuses_what_it_does_not_handle(kernel):
    q = torch.zeros(1, 1, 2, 64)  # float32
    cache = torch.zeros(1, 16, 64).bfloat16()
    with pytest.raises(RuntimeError, match="bf16"):
        kernel.paged_decode(q, cache, cache, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), 16)


def test_engine_with_native_attention_agrees_with_the_eager_path(tiny_llama_hd64):
    from engine import EngineConfig, LLMEngine, SamplingParams

    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0)
    prompts = [[5, 17, 42, 8, 99, 3, 11, 2, 7], [9, 4, 4, 61], list(range(3, 40))]
    res = {}
    for backend in ("fast", "native"):
        eng = LLMEngine(EngineConfig(model=str(tiny_llama_hd64), dtype="bfloat16", num_kv_blocks=64,
                                     block_size=4, attention_backend=backend))
        assert (eng.runner.native_decode is not None) == (backend == "native")
        res[backend] = [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in eng.generate(prompts, params)]
        assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks  # every block returned
    for (ids_n, lp_n), (ids_f, lp_f) in zip(res["native"], res["fast"]):
        agree = next((i for i, (a, b) in enumerate(zip(ids_n, ids_f)) if a != b), len(ids_n))
        assert agree >= 3  # bf16 near-ties may flip later tokens; the first decode steps must agree
        assert lp_n[:agree] == pytest.approx(lp_f[:agree], abs=0.05)


def test_a_dead_build_lock_is_cleared_at_once(tmp_path, monkeypatch):
    """Under the machine build lock no live process is building: a lock file torch left is removed at
    once, with a warning (it used to wait 600 s in silence)."""
    import torch.utils.cpp_extension as ext

    from engine.kernels import build

    monkeypatch.setattr(ext, "_get_build_directory", lambda name, verbose=False: str(tmp_path / name))
    (tmp_path / "x").mkdir()
    lock = tmp_path / "x" / "lock"
    lock.write_text("")
    with build._machine_build_lock("x"), pytest.warns(UserWarning, match="did not finish"):
        build._clear_dead_lock("x")
    assert not lock.exists()


def test_whole_and_cut_short_binaries_are_told_apart(kernel, tmp_path):
    """A module cut short (a build killed while linking, a full disk) is not loaded: loading it kills the
    process with SIGBUS, on every start, before any warning."""
    from pathlib import Path

    from engine.kernels import load

    so = Path(kernel.__file__).read_bytes()
    whole = tmp_path / "whole.so"
    whole.write_bytes(so)
    assert load._binary_whole(whole)
    for cut in (len(so) - 1, len(so) // 2, 1000, 10, 0):
        (tmp_path / "cut.so").write_bytes(so[:cut])
        assert not load._binary_whole(tmp_path / "cut.so"), cut
    (tmp_path / "zeros.so").write_bytes(bytes(len(so)))  # a file of the right size, never written
    assert not load._binary_whole(tmp_path / "zeros.so")


LOAD = """
import warnings, engine.kernels as k
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    m = k.kernel_module(tier={tier!r})
print("LOADED" if m is not None and m.__file__.startswith({folder!r}) else "NOT LOADED")
print("WARNED" if any("was damaged" in str(w.message) for w in seen) else "QUIET")
"""


def test_a_damaged_build_is_made_again_not_loaded(tmp_path):
    """The built module cut short, then changed in place (its size kept): each start removes it, saying so,
    and links it again (the object file is whole: no compile); a whole one loads in silence. One tier: the
    check does not depend on it."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from engine import kernels

    tier = kernels.cpu_tier()
    folder = Path(built_kernel(paged_decode_kernel, tier).__file__).parent
    copy = tmp_path / "ext" / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("lock", "*.inferlab-sha256"))
    so = copy / f"{folder.name}.so"
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))

    def start() -> list[str]:
        proc = subprocess.run([sys.executable, "-c", LOAD.format(tier=tier, folder=str(copy))], env=env,
                              capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent)
        assert proc.returncode == 0, proc.stderr[-2000:]  # SIGBUS: -7
        return proc.stdout.split()

    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])
    assert start() == ["LOADED", "WARNED"]
    assert so.with_name(so.name + ".inferlab-sha256").is_file()
    assert start() == ["LOADED", "QUIET"]
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    assert start() == ["LOADED", "WARNED"]
    assert start() == ["LOADED", "QUIET"]

