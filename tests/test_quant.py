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


@pytest.mark.parametrize("fmt,group", [("int8", 64), ("fp8-e4m3", 64), ("int4", 32), ("int4", 64), ("int4", 128)])
@pytest.mark.parametrize("outliers", [0, 4])
def test_fast_kernel_equals_reference(fmt, group, outliers):
    idx = torch.arange(outliers) * 7 if outliers else None
    fast = QuantLinear(W, None, fmt, group, idx)
    ref = QuantLinear(W, None, fmt, group, idx, reference=True)
    if fmt == "int4":  # int4 runs on the native weight-streaming kernel
        from engine.kernels import stream_linear_kernel

        fast.stream = ref.stream = stream_linear_kernel()
        assert fast.stream is not None
    assert fast.scheme.fast_ok(fast, X) and ref.reference  # really two different paths
    torch.testing.assert_close(fast.dequantize(), ref.dequantize(), atol=1e-2, rtol=1e-2)
    a, b = fast(X).float(), ref(X).float()
    assert float((a - b).norm() / b.norm()) < 0.01  # a few bf16 roundings apart, no more


@pytest.mark.parametrize("fmt,limit", [("int8", 0.01), ("fp8-e4m3", 0.05), ("int4", 0.12)])
def test_quantization_error_is_small_and_outliers_help(fmt, limit):
    w = W.float().clone()
    w[:, 3] *= 40  # one outlier input channel stretches every scale it touches
    w = w.to(torch.bfloat16)
    plain = QuantLinear(w, None, fmt, 64)
    kept = QuantLinear(w, None, fmt, 64, torch.tensor([3]))
    def err(m, ref):
        return float((m.dequantize() - ref.float()).norm() / ref.float().norm())

    assert err(QuantLinear(W, None, fmt, 64), W) < limit
    assert err(kept, w) < err(plain, w)
    assert kept.nbytes() < w.numel() * 2


def make(folder, **kw):
    kw.setdefault("num_kv_blocks", 64)
    return LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", quant_group_size=32, **kw))


def test_engine_weights_shrink_and_budget_buys_blocks(tiny_llama):
    budget = 2 * 2**20
    engines = {f: make(tiny_llama, quant_format=f, num_kv_blocks=None, memory_budget_bytes=budget)
               for f in ("bf16", "int8", "fp8-e4m3", "int4")}
    w = {f: e.memory().weights_bytes for f, e in engines.items()}
    blocks = {f: e.memory().kv_blocks_total for f, e in engines.items()}
    assert w["int4"] < w["int8"] == w["fp8-e4m3"] < w["bf16"]  # fp8 keeps a byte per weight, as int8
    assert blocks["int4"] > blocks["int8"] == blocks["fp8-e4m3"] > blocks["bf16"]
    for e in engines.values():
        out = e.generate(["Hello world"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
        assert len(out.token_ids) == 8


def test_requantize_at_runtime_from_originals_keeps_requests(tiny_llama):
    eng = make(tiny_llama)
    direct8 = make(tiny_llama, quant_format="int8")
    ids = [eng.add_request("The quick brown fox", SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.0))
           for _ in range(3)]
    eng.step()
    errors = eng.set_quantization("int4")
    assert errors and all(0 < e < 0.2 for e in errors.values())
    eng.step()
    assert eng.config.quant_format == "int4"
    eng.set_quantization("int8")  # from the 16-bit originals, not from the 4-bit weights
    finished = set()
    while eng.has_unfinished():
        finished |= {o.request_id for o in eng.step() if o.finished}
    assert finished == set(ids)
    a = eng.model.layers[0].mlp.down_proj.dequantize()
    b = direct8.model.layers[0].mlp.down_proj.dequantize()
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_requantizing_at_runtime_resizes_the_kv_cache(tiny_llama):
    budget = 2 * 2**20
    fresh4 = make(tiny_llama, quant_format="int4", num_kv_blocks=None, memory_budget_bytes=budget)
    eng = make(tiny_llama, num_kv_blocks=None, memory_budget_bytes=budget)
    start = eng.memory().kv_blocks_total
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request(f"The quick brown fox {i}", p) for i in range(4)]
    eng.step()
    eng.set_quantization("int4")
    eng.step()
    grown = eng.memory().kv_blocks_total
    assert abs(grown - fresh4.memory().kv_blocks_total) <= 1 and grown > start
    assert eng.runner.kv_caches[0][0].shape[1] == grown * eng.config.block_size
    eng.set_quantization("bf16")
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
    for fmt in ("int8", "fp8-e4m3", "int4"):
        eng.set_quantization(fmt)
        eng.step()  # the swap happens at the top of a step
        quality[fmt] = compare_logits(eng, texts, ref)
    q8, f8, q4 = quality["int8"], quality["fp8-e4m3"], quality["int4"]
    # measured on this tiny random model: int8 KL ~0.011 nats, agreement ~0.91; int4 ~0.8, ~0.35
    assert 0 < q8["kl_divergence"] < 0.05 and q8["greedy_agreement"] > 0.8
    # fp8 e4m3 (3 mantissa bits: ~1/16 relative error per weight) loses more than int8's 255 even steps on these
    # near-Gaussian weights, and less than int4
    assert q8["kl_divergence"] < f8["kl_divergence"] < q4["kl_divergence"]
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
    eng.set_quantization("int4")
    eng.step()
    four = m.measure(eng)
    separate = compare_logits(eng, texts, ref, meter.WINDOW)
    assert four["perplexity"] == pytest.approx(perplexity(eng, texts, meter.WINDOW), rel=1e-6)
    assert four["perplexity"] != pytest.approx(first["perplexity"], rel=1e-3)
    assert four["kl_divergence"] == pytest.approx(separate["kl_divergence"], rel=1e-4)
    assert four["greedy_agreement_pct"] == pytest.approx(100 * separate["greedy_agreement"])


def test_tied_embeddings_and_head_share_one_int8_table(tiny_tied):
    from engine.quant.embeddings import Int8Embedding

    plain = make(tiny_tied, quant_format="int8")
    eng = make(tiny_tied, quant_format="int8", quant_embeddings=True)
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
    report = eng.set_quantization("int8")
    assert 0 < report["embed_tokens"] < 0.01 and report["lm_head"] == report["embed_tokens"]
    eng.set_quantization("bf16")  # back to the original tied 16-bit table
    eng.step()
    assert eng.model.lm_head.weight is eng.model.embed_tokens.weight
    ref = make(tiny_tied)
    assert eng.generate(["Hello world"], p)[0].token_ids == ref.generate(["Hello world"], p)[0].token_ids


def test_untied_head_follows_the_format_and_embeddings_stay_int8(tiny_llama):
    eng = make(tiny_llama, quant_format="int4", quant_embeddings=True)
    assert eng.model.lm_head.format.name == "int4" and eng.model.embed_tokens.qweight.dtype == torch.int8
    assert eng.memory().weights_bytes < make(tiny_llama, quant_format="int4").memory().weights_bytes
    report = eng.set_quantization("int4")
    assert report["lm_head"] > report["embed_tokens"] > 0  # 4-bit groups lose more than int8 rows
    out = eng.generate(["The quick brown fox"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 8


def test_fp8_stores_e4m3_codes_and_a_scale_per_row():
    """The fp8-e4m3 format: one byte per weight as torch.float8_e4m3fn, one bf16 scale per output row (the
    row's largest weight maps to e4m3's 448), and a bit count that int8 shares."""
    layer = QuantLinear(W, None, "fp8-e4m3", 32)
    assert layer.qweight.dtype == torch.float8_e4m3fn and layer.qweight.shape == W.shape
    assert layer.scales.dtype == torch.bfloat16 and layer.scales.shape == (W.shape[0],)
    assert float(layer.qweight.float().abs().amax()) == pytest.approx(448, rel=0.01)
    assert layer.format.bits == QuantLinear(W, None, "int8", 32).format.bits == 8
    from engine.quant.fp8 import widen  # the CPU's table lookup: torch's own cast, bit for bit
    assert torch.equal(widen(layer.qweight, torch.bfloat16), layer.qweight.to(torch.bfloat16))
    all_bytes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    widened, cast = widen(all_bytes, torch.float32), all_bytes.to(torch.float32)
    assert torch.equal(widened.nan_to_num(7.0), cast.nan_to_num(7.0))  # every byte, its two NaNs as NaNs
    assert layer.kernel_operands() == "fp8 weights (no native fp8 kernel: the layer-by-layer path multiplies them)"
    row = W[0].float()  # e4m3's relative step: 2**-3 at most, so every weight within 1/16 of itself (+ tiny ones)
    deq = layer.dequantize()[0]
    assert float(((deq - row).abs() / row.abs().clamp(min=float(row.abs().amax()) / 448 * 2**-6)).max()) < 0.07


def test_a_quant_format_is_asked_for_by_name():
    with pytest.raises(ValueError, match="quant_format must be one of"):
        QuantLinear(W, None, 8, 32)  # a bit count is not a format: int8 and fp8-e4m3 both have 8
    with pytest.raises(ValueError, match="QuantLinear takes a quantized format"):
        QuantLinear(W, None, "bf16", 32)


def test_fp8_engine_serves_and_requantizes(tiny_llama):
    """End to end in the engine: built in fp8, requantized at run time from the originals to fp8 and back."""
    p = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    eng = make(tiny_llama, quant_format="fp8-e4m3")
    assert eng.model.layers[0].mlp.down_proj.qweight.dtype == torch.float8_e4m3fn
    assert len(eng.generate(["Hello world"], p)[0].token_ids) == 8
    live = make(tiny_llama)
    live.set_quantization("fp8-e4m3")
    live.step()
    assert live.config.quant_format == "fp8-e4m3"
    torch.testing.assert_close(live.model.layers[0].mlp.down_proj.dequantize(),
                               eng.model.layers[0].mlp.down_proj.dequantize(), atol=0, rtol=0)
