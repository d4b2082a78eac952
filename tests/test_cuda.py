"""What only a GPU can prove (marked `cuda`: skipped where torch sees none; scripts/gpu_check.sh runs
them). Only the first has run on a GPU (an H200, 2026-12-04: it passed; the rest did not run, the
compiled FlexAttention then the default took their time); the same logic is tested on the CPU in
tests/test_device_placement.py."""
from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.cuda
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = ["Hello there", "The quick brown fox", "Paged attention"]


def _engine(model, **kw) -> LLMEngine:
    kw.setdefault("kv_cache_memory_bytes", 64 * 2**20)
    return LLMEngine(EngineConfig(model=str(model), device="cuda", **kw))


def test_greedy_tokens_match_the_cpu_in_float32(tiny_llama):
    gpu = _engine(tiny_llama, dtype="float32")
    cpu = LLMEngine(EngineConfig(model=str(tiny_llama), device="cpu", dtype="float32", num_kv_blocks=64))
    assert gpu.device.type == "cuda" and gpu.runner.kv_caches[0][0].is_cuda
    got = [o.token_ids for o in gpu.generate(PROMPTS, GREEDY)]
    want = [o.token_ids for o in cpu.generate(PROMPTS, GREEDY)]
    assert got == want


def test_sampling_with_a_seed_runs_on_the_device(tiny_llama):
    eng = _engine(tiny_llama)
    params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, top_k=20, seed=3, logprobs=2, ignore_eos=True)
    a, b = eng.generate(["Hi"], params)[0], eng.generate(["Hi"], params)[0]
    assert a.token_ids == b.token_ids and len(a.token_ids) == 8


def test_explicit_budget_is_honoured_and_auto_is_profiled(tiny_llama):
    eng = _engine(tiny_llama, kv_cache_memory_bytes=8 * 2**20)
    assert eng.runner.kv_cache_bytes <= 8 * 2**20
    auto = LLMEngine(EngineConfig(model=str(tiny_llama), device="cuda", gpu_memory_utilization=0.3))
    free, total = torch.cuda.mem_get_info(auto.device)
    assert auto.runner.kv_cache_bytes <= 0.3 * total
    assert auto.generate(PROMPTS, GREEDY)[0].token_ids


def test_requantizing_at_run_time_on_the_gpu(tiny_llama):
    eng = _engine(tiny_llama, quant_outlier_channels=2)
    ref = eng.generate(PROMPTS[:1], GREEDY)[0].token_ids
    for fmt in ("int8", "int4", "bf16"):
        report = eng.set_quantization(fmt)
        out = eng.generate(PROMPTS[:1], GREEDY)[0].token_ids
        assert len(out) == 8 and all(v == v for v in report.values())
        devices = {b.device.type for m in eng.model.modules() for b in m.buffers(recurse=False)}
        assert devices <= {"cuda"}
    assert eng.generate(PROMPTS[:1], GREEDY)[0].token_ids == ref  # back at 16 bits from the originals


def test_draft_speculation_fits_one_budget(tiny_llama):
    eng = _engine(tiny_llama, spec_method="draft", num_speculative_tokens=3, kv_cache_memory_bytes=16 * 2**20)
    total = eng.runner.kv_cache_bytes + eng.proposer.runner.kv_cache_bytes
    assert total <= 16 * 2**20
    plain = _engine(tiny_llama)
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == \
        [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]


def test_release_memory_gives_the_kv_cache_back_to_the_gpu(tiny_llama):
    eng = _engine(tiny_llama, kv_cache_memory_bytes=256 * 2**20)
    before = torch.cuda.memory_allocated(eng.device)
    eng.release_memory()
    freed = before - torch.cuda.memory_allocated(eng.device)
    assert freed >= eng.block_manager.num_blocks * eng.block_bytes + eng.weights_bytes  # KV and weights
    assert all(not t.is_cuda for t in eng.model.parameters())
    eng.restore_memory()
    assert all(t.is_cuda for t in eng.model.parameters())
    assert eng.generate(PROMPTS[:1], GREEDY)[0].token_ids


def test_memory_snapshot_counts_only_this_process(tiny_llama):
    eng = _engine(tiny_llama)
    eng.generate(PROMPTS, GREEDY)
    snap = eng.memory()
    assert snap.source in ("nvml", "torch.cuda") and snap.device.startswith("cuda")
    assert snap.weights_bytes + snap.kv_bytes_total + snap.other_bytes <= torch.cuda.memory_reserved(eng.device) + 1


def test_int4_uses_the_packed_cuda_kernel_and_matches_the_reference():
    from engine.quant.weight_only import QuantLinear

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("torch's int4 matmul needs compute capability 8.0+")
    torch.manual_seed(0)
    w = (torch.randn(256, 512) * 0.05).to(torch.bfloat16).cuda()
    fast = QuantLinear(w, None, "int4", 32)
    ref = QuantLinear(w, None, "int4", 32, reference=True)
    assert fast.packed is not None
    x = torch.randn(5, 512, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(fast(x).float(), ref(x).float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fast.dequantize(), ref.dequantize(), atol=1e-2, rtol=1e-2)


def test_int8_takes_the_fused_kernel_for_decode_rows_and_matches_the_reference():
    from engine.quant.weight_only import QuantLinear

    torch.manual_seed(0)
    w = (torch.randn(256, 512) * 0.05).to(torch.bfloat16).cuda()
    fast, ref = QuantLinear(w, None, "int8", 32), QuantLinear(w, None, "int8", 32, reference=True)
    if not fast.int8_fused:
        pytest.skip(f"torch {torch.__version__} has no CUDA _weight_int8pack_mm: int8 casts its weight per call")
    for rows in (1, 4, 64):  # the fused kernel, then (64 rows) the cast-and-GEMM path
        x = torch.randn(rows, 512, dtype=torch.bfloat16, device="cuda")
        torch.testing.assert_close(fast(x).float(), ref(x).float(), atol=2e-2, rtol=2e-2)


def test_the_self_draft_is_4_bit_on_the_packed_int4_kernel(tiny_llama):
    eng = _engine(tiny_llama, spec_method="draft", num_speculative_tokens=3)
    layers = [m for m in eng.proposer.model.modules() if hasattr(m, "packed")]
    assert layers and all(m.format.name == "int4" and m.packed is not None for m in layers)


def test_mtp_heads_train_on_the_gpu(tiny_llama):
    from engine.spec.mtp_train import fit_heads, original_weights, training_data

    eng = _engine(tiny_llama)
    data = training_data(eng, 2, ["Hello there", "a b c d e f"], max_tokens=12)
    assert data["train"][0].is_cuda
    heads, measured = fit_heads(data, original_weights(eng), 2, epochs=1, lr=1e-3)
    assert next(heads.parameters()).is_cuda and len(measured["val_top1_per_head"]) == 2



def test_cuda_graphs_replay_decode_steps_exactly(tiny_llama):
    graphs = _engine(tiny_llama, dtype="float32", cuda_graphs=True)
    eager = _engine(tiny_llama, dtype="float32")
    assert [o.token_ids for o in graphs.generate(PROMPTS, GREEDY)] == \
        [o.token_ids for o in eager.generate(PROMPTS, GREEDY)]
    g = graphs.runner.graphs
    assert g.num_captures > 0 and g.num_replays > 0


def test_graphs_are_captured_at_start_up_inside_the_profiled_budget(tiny_llama):
    """profile -> graphs measured -> KV sized; every start-up bucket captured before the first step, on
    FlexAttention at max_model_len's context bucket, so decode steps replay them without a new capture."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), device="cuda", dtype="float32", gpu_memory_utilization=0.3,
                                 cuda_graphs=True, max_num_seqs=8, max_model_len=256))
    sizing, g = eng.weights.kv_sizing, eng.runner.graphs
    assert sizing.steps == ["profile", "graphs", "kv"] and sizing.peak_step_bytes > 0 and sizing.graphs_bytes > 0
    assert [b for b, _ in g.startup_buckets] == [1, 2, 4, 8] and g.num_captures == 4 and g.capture_error is None
    assert g.pool_bytes > 0 and eng.memory().graphs_bytes == g.pool_bytes
    eager = _engine(tiny_llama, dtype="float32")
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == \
        [o.token_ids for o in eager.generate(PROMPTS, GREEDY)]
    assert g.num_replays > 0 and g.num_captures == 4  # nothing captured after start-up



def test_the_graphs_take_no_more_bytes_over_a_far_larger_cache(tiny_llama):
    """FlexAttention's block mask inside the graphs is as wide as the context bucket, not the cache: the
    start-up capture over 400,000 blocks (3.2 GB of KV) takes no more than over 64 (the first engine also
    pays the kernels' first build; 16 MiB of slack for the allocator's segments). A mask with a column
    per page would hold about 100 MB more there (predicted, from its tensors' shapes)."""
    taken = []
    for blocks in (64, 400_000):
        eng = _engine(tiny_llama, dtype="float32", num_kv_blocks=blocks, cuda_graphs=True, max_num_seqs=8,
                      max_model_len=256)
        g = eng.runner.graphs
        assert g.capture_error is None and g.num_captures == 4 and eng.block_manager.num_blocks == blocks
        taken.append(g.pool_bytes)
        del eng, g
        torch.cuda.empty_cache()
    assert taken[1] <= taken[0] + 16 * 2**20, taken

def test_one_read_back_per_step_with_sampling_verifies(tiny_llama):
    import engine.models.layers.read_back as read_back

    eng = _engine(tiny_llama, spec_method="ngram", num_speculative_tokens=3)
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=2, ignore_eos=True)
    eng.add_request("a b c a b c a b c a b", params)
    eng.add_request("one two one two one two", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        before = read_back.count
        eng.step()
        assert read_back.count - before <= 1
