"""Weight-only quantization: fast kernels agree with dequantize-then-matmul, memory shrinks, requantizing
starts from the original weights, and quality is measured."""
from __future__ import annotations

import math

import pytest
import torch
import transformers

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.quant.weight_only import QuantLinear

torch.manual_seed(0)
W = torch.randn(256, 256).to(torch.bfloat16)
X = torch.randn(5, 256).to(torch.bfloat16)


@pytest.mark.parametrize("bits,group", [(8, 64), (4, 32), (4, 64), (4, 128)])
@pytest.mark.parametrize("outliers", [0, 4])
def test_fast_kernel_equals_reference(bits, group, outliers):
    idx = torch.arange(outliers) * 7 if outliers else None
    fast = QuantLinear(W, None, bits, group, idx)
    ref = QuantLinear(W, None, bits, group, idx, reference=True)
    if bits == 4:  # int4 runs on the native weight-streaming kernel
        from engine.kernels import stream_linear_kernel

        fast.stream = ref.stream = stream_linear_kernel()
        assert fast.stream is not None
    assert fast.scheme.fast_ok(fast, X) and ref.reference  # really two different paths
    torch.testing.assert_close(fast.dequantize(), ref.dequantize(), atol=1e-2, rtol=1e-2)
    a, b = fast(X).float(), ref(X).float()
    assert float((a - b).norm() / b.norm()) < 0.01  # a few bf16 roundings apart, no more


@pytest.mark.parametrize("bits,limit", [(8, 0.01), (4, 0.12)])
def test_quantization_error_is_small_and_outliers_help(bits, limit):
    w = W.float().clone()
    w[:, 3] *= 40  # one outlier input channel stretches every scale it touches
    w = w.to(torch.bfloat16)
    plain = QuantLinear(w, None, bits, 64)
    kept = QuantLinear(w, None, bits, 64, torch.tensor([3]))
    def err(m, ref):
        return float((m.dequantize() - ref.float()).norm() / ref.float().norm())

    assert err(QuantLinear(W, None, bits, 64), W) < limit
    assert err(kept, w) < err(plain, w)
    assert kept.nbytes() < w.numel() * 2


def make(folder, **kw):
    kw.setdefault("num_kv_blocks", 64)
    return LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", quant_group_size=32, **kw))


def test_engine_weights_shrink_and_budget_buys_blocks(tiny_llama):
    budget = 2 * 2**20
    engines = {b: make(tiny_llama, quant_bits=b, num_kv_blocks=None, memory_budget_bytes=budget)
               for b in (16, 8, 4)}
    w = {b: e.memory().weights_bytes for b, e in engines.items()}
    blocks = {b: e.memory().kv_blocks_total for b, e in engines.items()}
    assert w[4] < w[8] < w[16]
    assert blocks[4] > blocks[8] > blocks[16]
    for e in engines.values():
        out = e.generate(["Hello world"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
        assert len(out.token_ids) == 8


def test_requantize_at_runtime_from_originals_keeps_requests(tiny_llama):
    eng = make(tiny_llama)
    direct8 = make(tiny_llama, quant_bits=8)
    ids = [eng.add_request("The quick brown fox", SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.0))
           for _ in range(3)]
    eng.step()
    errors = eng.set_quantization(4)
    assert errors and all(0 < e < 0.2 for e in errors.values())
    eng.step()
    assert eng.config.quant_bits == 4
    eng.set_quantization(8)  # from the 16-bit originals, not from the 4-bit weights
    finished = set()
    while eng.has_unfinished():
        finished |= {o.request_id for o in eng.step() if o.finished}
    assert finished == set(ids)
    a = eng.model.layers[0].mlp.down_proj.dequantize()
    b = direct8.model.layers[0].mlp.down_proj.dequantize()
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_requantizing_at_runtime_resizes_the_kv_cache(tiny_llama):
    budget = 2 * 2**20
    fresh4 = make(tiny_llama, quant_bits=4, num_kv_blocks=None, memory_budget_bytes=budget)
    eng = make(tiny_llama, num_kv_blocks=None, memory_budget_bytes=budget)
    start = eng.memory().kv_blocks_total
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request(f"The quick brown fox {i}", p) for i in range(4)]
    eng.step()
    eng.set_quantization(4)
    eng.step()
    grown = eng.memory().kv_blocks_total
    assert abs(grown - fresh4.memory().kv_blocks_total) <= 1 and grown > start
    assert eng.runner.kv_caches[0][0].shape[1] == grown * eng.config.block_size
    eng.set_quantization(16)
    finished = {o.request_id for o in _drain(eng) if o.finished}
    assert finished == set(ids)  # nothing lost across both resizes
    eng.step()
    assert eng.memory().kv_blocks_total == start and eng.block_manager.num_used_blocks == 0
    out = eng.generate(["The quick brown fox"], p)[0]
    assert out.token_ids == make(tiny_llama).generate(["The quick brown fox"], p)[0].token_ids


def _drain(eng):
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    return outs


def test_perplexity_matches_transformers_loss(tiny_llama):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=128))
    text = "The quick brown fox jumps over the lazy dog. Paged attention stores keys and values in blocks."
    ids = eng.tokenizer.encode(text)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        loss = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss
    assert eng.perplexity([text]) == pytest.approx(math.exp(float(loss)), rel=1e-4)


def test_quality_vs_16_bits(tiny_llama):
    from engine.quant.quality import compare_logits, heldout_texts, reference_logits

    texts = heldout_texts()[:2]
    eng = make(tiny_llama, num_kv_blocks=256)
    ref = reference_logits(eng, texts)
    same = compare_logits(eng, texts, ref)
    assert same["kl_divergence"] == pytest.approx(0, abs=1e-6) and same["greedy_agreement"] == 1.0
    quality = {}
    for bits in (8, 4):
        eng.set_quantization(bits)
        eng.step()  # the swap happens at the top of a step
        quality[bits] = compare_logits(eng, texts, ref)
    q8, q4 = quality[8], quality[4]
    # measured on this tiny random model: 8 bits KL ~0.011 nats, agreement ~0.91; 4 bits ~0.8, ~0.35
    assert 0 < q8["kl_divergence"] < 0.05 and q8["greedy_agreement"] > 0.8
    assert 10 * q8["kl_divergence"] < q4["kl_divergence"] < 3.0
    assert 0.1 < q4["greedy_agreement"] < q8["greedy_agreement"]  # far above chance (1 / 384), below 8 bits


def test_comparison_quality_in_one_pass_equals_the_separate_passes(tiny_llama):
    # prepare's quantization chapter scores each window once (perplexity, and KL / agreement on the first
    # windows against the first configuration's): the same figures as perplexity() and compare_logits()
    from app.talk.compare import quality as meter
    from engine.quant.quality import compare_logits, perplexity, reference_logits

    eng = make(tiny_llama, num_kv_blocks=256)
    m = meter.QualityMeter()
    first = m.measure(eng)
    texts = meter.scored_texts()
    assert len(meter.windows(eng, texts, meter.WINDOW)) > meter.KL_WINDOWS  # perplexity reads more windows
    assert first["perplexity"] == pytest.approx(perplexity(eng, texts, meter.WINDOW), rel=1e-6)
    assert first["kl_divergence"] == pytest.approx(0, abs=1e-6) and first["greedy_agreement_pct"] == 100
    ref = reference_logits(eng, texts, meter.WINDOW)[:meter.KL_WINDOWS]
    eng.set_quantization(4)
    eng.step()
    four = m.measure(eng)
    separate = compare_logits(eng, texts, ref, meter.WINDOW)
    assert four["perplexity"] == pytest.approx(perplexity(eng, texts, meter.WINDOW), rel=1e-6)
    assert four["perplexity"] != pytest.approx(first["perplexity"], rel=1e-3)
    assert four["kl_divergence"] == pytest.approx(separate["kl_divergence"], rel=1e-4)
    assert four["greedy_agreement_pct"] == pytest.approx(100 * separate["greedy_agreement"])


def test_tied_embeddings_and_head_share_one_int8_table(tiny_tied):
    from engine.quant.embeddings import Int8Embedding

    plain = make(tiny_tied, quant_bits=8)
    eng = make(tiny_tied, quant_bits=8, quant_embeddings=True)
    emb, head = eng.model.embed_tokens, eng.model.lm_head
    assert isinstance(emb, Int8Embedding) and emb.qweight is head.qweight and emb.scales is head.scales
    vocab, hidden = emb.qweight.shape
    # the 16-bit table (stored once, tied) becomes one int8 table plus a scale per row, still stored once
    saved = plain.memory().weights_bytes - eng.memory().weights_bytes
    # (and a 16-bit head's oneDNN-packed copy with it, where pack_weights keeps one; by default none)
    assert plain.model.lm_head.packed_bytes() == 0
    assert saved == vocab * hidden * 2 - (vocab * hidden + vocab * 2) + plain.model.lm_head.packed_bytes()
    ids = torch.tensor([3, 1, 3, vocab - 1])
    torch.testing.assert_close(emb(ids).float(), emb.dequantize()[ids].to(torch.bfloat16).float())
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert len(eng.generate(["Hello world"], p)[0].token_ids) == 12
    report = eng.set_quantization(8)
    assert 0 < report["embed_tokens"] < 0.01 and report["lm_head"] == report["embed_tokens"]
    eng.set_quantization(16)  # back to the original tied 16-bit table
    eng.step()
    assert eng.model.lm_head.weight is eng.model.embed_tokens.weight
    ref = make(tiny_tied)
    assert eng.generate(["Hello world"], p)[0].token_ids == ref.generate(["Hello world"], p)[0].token_ids


def test_untied_head_follows_the_bits_and_embeddings_stay_int8(tiny_llama):
    eng = make(tiny_llama, quant_bits=4, quant_embeddings=True)
    assert eng.model.lm_head.bits == 4 and eng.model.embed_tokens.qweight.dtype == torch.int8
    assert eng.memory().weights_bytes < make(tiny_llama, quant_bits=4).memory().weights_bytes
    report = eng.set_quantization(4)
    assert report["lm_head"] > report["embed_tokens"] > 0  # 4-bit groups lose more than int8 rows
    out = eng.generate(["The quick brown fox"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 8
