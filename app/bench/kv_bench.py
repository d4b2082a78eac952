"""`inferlab bench kv`: the 16-bit KV cache against the 8-bit one (kv_cache_dtype="int8") on the same
weights, in one run: bytes per block, blocks the same memory buys, quality on the held-out text
(perplexity, KL and teacher-forced top-1 agreement against the 16-bit cache), free-running greedy
agreement on a few prompts, and decode speed with many streams."""
from __future__ import annotations

from app.bench.quant_bench import decode_rate
from app.load.workload import corpus_tokens
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.events import KvCacheDtype
from engine.quant.quality import compare_logits, heldout_texts, reference_logits

KV_DTYPES = tuple(KvCacheDtype)


def add_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="write the results here")
    p.add_argument("--kv-cache-mib", type=int, default=64, help="the KV budget both caches get")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="free-running greedy generations compared")


def _generations(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [list(o.token_ids) for o in engine.generate(prompts, params)]


def _prefix_agreement(a: list[int], b: list[int]) -> int:
    """Tokens the two generations share before they first differ."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run(args) -> dict:
    texts = heldout_texts()
    results: dict[str, dict] = {}
    reference = base_gen = None
    for kv in KV_DTYPES:
        cfg = EngineConfig(model=args.model, dtype=args.dtype, device=args.device, num_threads=args.threads,
                           kv_cache_dtype=kv, kv_cache_memory_bytes=args.kv_cache_mib * 2**20, max_num_seqs=64)
        engine = LLMEngine(cfg)
        mem = engine.memory()
        corpus = corpus_tokens(engine.tokenizer)
        prompts = [corpus[i * 97 : i * 97 + 48] for i in range(args.prompts)]
        if reference is None:
            reference = reference_logits(engine, texts)
        gens = _generations(engine, prompts, args.max_tokens)
        base_gen = base_gen or gens
        row = {"kv_block_bytes": mem.kv_block_bytes, "kv_blocks": mem.kv_blocks_total,
               "kv_tokens": mem.kv_blocks_total * cfg.block_size, "perplexity": engine.perplexity(texts),
               **compare_logits(engine, texts, reference),
               "greedy_tokens_equal": sum(_prefix_agreement(a, b) for a, b in zip(gens, base_gen)),
               "greedy_tokens_total": sum(len(g) for g in gens),
               f"decode_tokens_per_s_{args.streams}_streams": decode_rate(
                   engine, corpus[: min(256, engine.max_model_len // 2)], args.streams, args.max_tokens)}
        results[kv] = row
        del engine
    base, q = results["auto"], results["int8"]
    return {"kv_cache_mib": args.kv_cache_mib, "heldout_text": "assets/heldout.txt", "results": results,
            "int8_vs_auto": {"blocks_ratio": q["kv_blocks"] / base["kv_blocks"],
                             "bytes_per_block_ratio": q["kv_block_bytes"] / base["kv_block_bytes"],
                             "perplexity_change_pct": 100 * (q["perplexity"] / base["perplexity"] - 1),
                             "decode_speed_ratio": q[f"decode_tokens_per_s_{args.streams}_streams"]
                             / base[f"decode_tokens_per_s_{args.streams}_streams"]}}
