"""Decode graphs built at start-up inside the measured memory budget (EngineConfig.cuda_graphs;
engine/runner/graphs.py). On the CPU the same code runs: the static buffers of every start-up bucket are
built (nothing is captured, so the graphs measure 0 bytes); the GPU's arithmetic is checked with torch's
memory queries stood in for."""
from __future__ import annotations

import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.runner.graphs import startup_batch_buckets
from engine.runner.setup import KvSizing, num_kv_blocks

GiB = 2**30
CUDA0 = torch.device("cuda", 0)
PROMPTS = ["Hello there", "The quick brown fox jumps over", "a"]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def test_a_gpu_budget_takes_the_profiled_step_then_the_graphs_off_before_sizing_the_kv(monkeypatch):
    calls: list[str] = []

    def mem_get_info(device=None):
        calls.append("free")
        return 70 * GiB, 80 * GiB  # 10 GiB in use (weights)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    sizing = KvSizing()
    profile = lambda: calls.append("profile") or 3 * GiB  # noqa: E731
    graphs = lambda: calls.append("graphs") or GiB  # noqa: E731
    blocks = num_kv_blocks(EngineConfig(gpu_memory_utilization=0.5), CUDA0, block_bytes=2**20,
                           profile_peak=profile, profile_graphs=graphs, sizing=sizing)
    # 80 GiB x 0.5 - 10 GiB in use - 3 GiB peak step - 1 GiB of graphs = 26 GiB
    assert blocks == 26 * 1024
    assert calls[:3] == ["profile", "graphs", "free"]  # the last query is check_fits'
    assert sizing.steps == ["profile", "graphs", "kv"] and sizing.graphs_bytes == GiB
    # a whole-memory budget leaves the graphs out too; an explicit KV budget is the KV's alone
    whole = EngineConfig(memory_budget_bytes=4 * GiB)
    assert num_kv_blocks(whole, CUDA0, 2**20, weights_bytes=GiB, profile_graphs=graphs) == 2 * 1024
    kv_only = EngineConfig(kv_cache_memory_bytes=GiB)
    assert num_kv_blocks(kv_only, CUDA0, 2**20, profile_graphs=graphs) == 1024


def test_the_cpu_builds_every_start_up_bucket_before_any_step_and_measures_0_bytes(tiny_llama, monkeypatch):
    """The order: the graphs measured on a throwaway runner, the KV cache sized, the graphs built on the
    engine's runner. flex reads each row's pages in place: the start-up buckets sit at max_model_len's
    context bucket and every later decode step runs in one of them (nothing built lazily); the tokens are
    the ordinary path's."""
    import engine.quant.manager as manager
    from engine.runner.graphs import DecodeGraphs

    calls: list[str] = []
    build_all, size_kv = DecodeGraphs.build_all, manager.num_kv_blocks
    monkeypatch.setattr(DecodeGraphs, "build_all", lambda self, runner, *a: calls.append(
        f"build on {runner.kv_caches[0][0].shape[1] // 4} blocks") or build_all(self, runner, *a))
    monkeypatch.setattr(manager, "num_kv_blocks", lambda *a: calls.append("kv sized") or size_kv(*a))
    kw = dict(model=str(tiny_llama), dtype="float32", attention_backend="flex", memory_budget_bytes=64 * 2**20,
              block_size=4, max_num_seqs=8, max_model_len=64)  # a whole-memory budget: the graphs come off it
    lines: list[str] = []
    eng = LLMEngine(EngineConfig(**kw, cuda_graphs=True), progress=lambda msg, frac: lines.append(msg))
    graphs = eng.runner.graphs
    blocks = eng.block_manager.num_blocks
    # the throwaway runner's build (1 block) runs inside the sizing, before its "kv" step; the real one after
    assert calls == ["kv sized", "build on 1 blocks", f"build on {blocks} blocks"]
    assert eng.weights.kv_sizing.steps == ["graphs", "kv"] and eng.weights.kv_sizing.graphs_bytes == 0
    built = [b for b, _ in graphs.startup_buckets]
    assert built == startup_batch_buckets(8) == [1, 2, 4, 8]
    assert {c for _, c in graphs.startup_buckets} == {16}  # 64 tokens / 4 per block
    steps = [m for m in lines if "decode graphs" in m]
    assert steps == [f"building (the CPU: no capture) decode graphs {i}/4" for i in range(1, 5)]
    assert graphs.built_buckets() == graphs.startup_buckets and graphs.num_runs == 0
    want = [o.token_ids for o in LLMEngine(EngineConfig(**kw)).generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == want
    assert graphs.num_runs > 5 and graphs.num_captures == 0
    assert graphs.built_buckets() == graphs.startup_buckets  # no bucket built lazily
    snap = eng.memory()
    assert snap.graphs_bytes == 0  # measured: nothing captured on the CPU
    assert LLMEngine(EngineConfig(**kw)).memory().graphs_bytes is None  # graphs off


def test_the_eager_gather_builds_wider_context_buckets_lazily(tiny_llama):
    """The eager decode attention gathers the whole bucket: start-up builds the narrowest context
    bucket, longer contexts build theirs when a step first needs one."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", attention_backend="fast",
                                 num_kv_blocks=64, block_size=4, max_num_seqs=2, cuda_graphs=True))
    graphs = eng.runner.graphs
    assert graphs.startup_buckets == [(1, 1), (2, 1)]
    eng.generate(PROMPTS[:2], GREEDY)
    assert set(graphs.startup_buckets) < set(graphs.built_buckets())


def test_a_cache_narrower_than_the_context_bucket_still_decodes_through_flex(tiny_llama):
    """24 pages: max_model_len's bucket (32 blocks) is wider than the cache. FlexAttention's block mask is
    as wide as the table, not the cache, so the start-up bucket stays max_model_len's, and so does a
    bucket built after a new cache."""
    kw = dict(model=str(tiny_llama), dtype="float32", attention_backend="flex", num_kv_blocks=24, block_size=4,
              max_num_seqs=2)
    eng = LLMEngine(EngineConfig(**kw, cuda_graphs=True))
    assert eng.runner.graphs.startup_buckets == [(1, 32), (2, 32)]
    want = [o.token_ids for o in LLMEngine(EngineConfig(**kw)).generate(PROMPTS[:2], GREEDY)]
    assert [o.token_ids for o in eng.generate(PROMPTS[:2], GREEDY)] == want
    eng.runner.invalidate_graphs()  # a new cache or new weights: buckets are built again as steps need them
    long = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)  # to 17+ blocks: a 32-block bucket
    assert eng.generate(PROMPTS[:1], long)[0].token_ids == LLMEngine(EngineConfig(**kw)).generate(PROMPTS[:1],
                                                                                                  long)[0].token_ids
    assert max(c for _, c in eng.runner.graphs.built_buckets()) == 32
    assert eng.runner.backend.flex.error is None  # a failing mask would have turned FlexAttention off
