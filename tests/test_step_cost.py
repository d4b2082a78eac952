"""FLOPs and bytes per step, against shapes computed by hand; the verdict against the roofs."""
from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.perf.roofline import Roofs, step_verdict
from engine.perf.step_cost import ModelShape, RequestWork, step_cost

# hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV heads, vocab 384 (the tests' tiny Llama)
TINY = ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  vocab_size=384, layer_weight_bytes=1000, lm_head_bytes=300, embed_row_bytes=128)


def test_prefill_plus_decode_by_hand():
    # a 5-token prefill from an empty cache (samples its last row) + a decode after 10 cached tokens
    cost = step_cost(TINY, [RequestWork(5, 0, 1), RequestWork(1, 10, 1)])
    # linears per token and layer: qkv 64*(4+2+2)*16 = 8192, o 64*64 = 4096, mlp 3*64*128 = 24576 -> 36864;
    # 2 layers -> 73728 multiply-adds per token; 6 tokens, 2 FLOPs each
    assert cost.linear_flops == 2 * 73728 * 6
    # keys attended: prefill 1+2+3+4+5 = 15, decode 10+1 = 11; QK^T + PV = 4 FLOPs per key per head dim
    assert cost.attention_flops == 4 * 2 * 4 * 16 * 26
    assert cost.lm_head_flops == 2 * 64 * 384 * 2
    assert cost.flops == 884736 + 13312 + 98304
    # weights once + lm_head (rows sampled) + 6 embedding rows
    assert cost.weight_bytes == 1000 + 300 + 6 * 128
    # K and V, 2 layers, 2 KV heads, 16 dims, 2 bytes = 256 bytes per token; read 5 + 11 positions, write 6
    assert cost.kv_read_bytes == 256 * 16 and cost.kv_write_bytes == 256 * 6
    # per token and layer: 64 + 128 + 64 + 64 + 64 + 256 + 128 + 64 = 832 values, 2 layers, 2 bytes;
    # plus 2 float32 logit rows of 384
    assert cost.activation_bytes == 832 * 2 * 2 * 6 + 2 * 384 * 4
    assert cost.bytes_moved == 2068 + 4096 + 1536 + 19968 + 3072


def test_prefill_chunk_that_samples_nothing_skips_lm_head():
    cost = step_cost(TINY, [RequestWork(4, 8, 0)])
    assert cost.lm_head_flops == 0 and cost.weight_bytes == 1000 + 4 * 128
    assert cost.attention_flops == 4 * 2 * 4 * 16 * (4 * 8 + 10)


def test_empty_step_costs_nothing():
    assert step_cost(TINY, []).flops == 0 and step_cost(TINY, []).bytes_moved == 0


def test_engine_steps_carry_counted_cost(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32,
                                    attention_backend="reference"))
    stats = []
    engine.add_listener(lambda e: stats.append(e.stats))
    engine.add_request(list(range(3, 10)), SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    vocab = engine.model_config.vocab_size
    prefill, decode = stats[0], stats[1]
    assert prefill.num_prefill_tokens == 7 and decode.num_decode_tokens == 1
    # 7 prompt tokens: keys 1+..+7 = 28; then one decode after 7 cached: keys 8
    assert prefill.flops == 2 * 73728 * 7 + 4 * 2 * 4 * 16 * 28 + 2 * 64 * vocab
    assert decode.flops == 2 * 73728 + 4 * 2 * 4 * 16 * 8 + 2 * 64 * vocab
    # float32: layers (qkv 8192 + o 4096 + gate_up 16384 + down 8192 + 2 norms of 64) x 2 + final norm 64
    layers = (36864 + 128) * 2 * 4 + 64 * 4
    head, row = 64 * vocab * 4, 64 * 4
    kv_token = 2 * 2 * 2 * 16 * 4
    act_token = 832 * 2 * 4
    assert decode.bytes_moved == layers + head + row + kv_token * 8 + kv_token + act_token + vocab * 4


def _roofs(flops=1e12, bw=1e10) -> Roofs:
    return Roofs("test cpu", 2, "x", {"bfloat16": flops, "float32": flops / 4}, bw, "test", "now")


def test_verdicts():
    r = _roofs()
    # 1 GFLOP, 1 MB: compute 1 ms vs memory 0.1 ms -> compute-bound at 1 ms: 100 %
    v = step_verdict(r, 10**9, 10**6, 0.001)
    assert v.bound == "compute-bound" and v.fraction == pytest.approx(1.0)
    # 1 MFLOP, 100 MB: memory 10 ms; in 20 ms -> memory-bound at 50 %
    v = step_verdict(r, 10**6, 10**8, 0.02)
    assert v.bound == "memory-bound" and v.fraction == pytest.approx(0.5)
    assert "memory-bound, 50 % of measured bandwidth" in v.describe("decode")
    # the same work in 100 ms: 10x the roofs' prediction -> overhead-bound
    assert step_verdict(r, 10**6, 10**8, 0.1).bound == "overhead-bound"
    assert step_verdict(r, 0, 0, 0.1) is None
