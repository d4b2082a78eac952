"""`inferlab bench quant`: the weight formats (bf16, int8, fp8-e4m3, int4) side by side in one run — bytes, KV
blocks, speed, and quality against bf16 on the held-out text (perplexity change, KL, top-1 agreement)."""
from __future__ import annotations

import time

from app.bench.runs import count_output_tokens, engine_one_stream
from app.device_args import device_options
from app.load.workload import corpus_tokens
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.drive import drive
from engine.quant.quality import compare_logits, heldout_texts, reference_logits
from engine.quant_formats import DENSE


def decode_rate(engine: LLMEngine, prompt: list[int], streams: int, max_tokens: int) -> float:
    """Output tokens/s with `streams` requests decoding together (prefill excluded)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(streams):
        engine.add_request(prompt[i % 7 :], params)
    sched = engine.scheduler
    drive(engine, max_steps=1)  # the requests arrive (they are queued until a step takes them)
    # finish every prefill first
    drive(engine, until=lambda: not (sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                                                            for r in sched.running)))
    t0 = time.perf_counter()
    produced = count_output_tokens(engine)
    return produced / (time.perf_counter() - t0)


def run_quant_bench(args) -> dict:
    texts = heldout_texts()
    results, reference, ppl16 = {}, None, None
    formats = sorted(args.quant_format, key=lambda f: f != DENSE)  # bf16 first: the quality reference
    for fmt in formats:
        cfg = EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads,
                           quant_format=fmt, quant_group_size=args.group_size,
                           quant_outlier_channels=args.outliers if fmt != DENSE else 0,
                           quant_embeddings=getattr(args, "embeddings", False),
                           memory_budget_bytes=args.memory_budget_mib * 2**20, max_num_seqs=64)
        engine = LLMEngine(cfg)
        mem = engine.memory()
        prompt = corpus_tokens(engine.tokenizer)[:32]
        engine_one_stream(engine, prompt, 8)  # warm-up
        one = engine_one_stream(engine, prompt, args.max_tokens)
        many = decode_rate(engine, prompt, args.streams, args.max_tokens)
        if reference is None:
            reference = reference_logits(engine, texts) if fmt == DENSE else None
        ppl = engine.perplexity(texts)
        ppl16 = ppl if fmt == DENSE else ppl16
        row = {"weights_bytes": mem.weights_bytes, "kv_blocks": mem.kv_blocks_total,
               "kv_tokens": mem.kv_blocks_total * cfg.block_size,
               "decode_tokens_per_s_1_stream": one["decode_tokens_per_s"],
               f"decode_tokens_per_s_{args.streams}_streams": many, "perplexity": ppl}
        if ppl16 is not None:
            row["perplexity_change_pct"] = 100 * (ppl / ppl16 - 1)
        if reference is not None:
            row.update(compare_logits(engine, texts, reference))
        if fmt != DENSE:
            errs = engine.set_quantization(fmt)  # same modules again, to read the per-layer error
            row["layer_error_mean"] = sum(errs.values()) / len(errs)
            row["layer_error_max"] = max(errs.values())
        results[fmt] = row
        del engine
    base = results.get(DENSE)
    if base:
        for row in results.values():
            row["speedup_1_stream_vs_bf16"] = row["decode_tokens_per_s_1_stream"] / base["decode_tokens_per_s_1_stream"]
    return {"group_size": args.group_size, "outlier_channels": args.outliers,
            "embeddings_quantized": getattr(args, "embeddings", False),
            "memory_budget_mib": args.memory_budget_mib, "heldout_text": "assets/heldout.txt",
            "results": results}
