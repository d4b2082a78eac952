"""`inferlab bench {throughput,decode} --json OUT`: side-by-side measurements in one run."""
from __future__ import annotations

import json
import platform
import time

import torch

from app.bench import hf_baseline, runs
from app.bench.workload import corpus_tokens, mixed_workload
from app.generate import stderr_progress
from engine import EngineConfig, LLMEngine


def add_bench_args(p, engine_args) -> None:
    sub = p.add_subparsers(dest="bench", required=True)
    tp = sub.add_parser("throughput", help="mixed workload: inferlab vs HF generate in static batches")
    dec = sub.add_parser("decode", help="one stream: inferlab vs HF generate")
    for q in (tp, dec):
        engine_args(q)
        q.add_argument("--json", metavar="OUT", help="write the results here")
        q.add_argument("--no-baseline", action="store_true", help="skip the HF transformers baseline")
    tp.add_argument("--num-chats", type=int, default=36)
    tp.add_argument("--num-docs", type=int, default=12)
    tp.add_argument("--hf-batch-size", type=int, default=8)
    tp.add_argument("--max-num-seqs", type=int, default=64)
    tp.add_argument("--max-num-batched-tokens", type=int, default=512)
    tp.add_argument("--kv-cache-mib", type=int, default=1024)
    dec.add_argument("--max-tokens", type=int, default=128)
    dec.add_argument("--prompt-tokens", type=int, default=32)


def run_bench(args) -> int:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    result = {"benchmark": args.bench, "model": args.model, "dtype": args.dtype,
              "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.bench == "throughput":
        result.update(_throughput(args))
    else:
        result.update(_decode(args))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def _engine(args, **kw) -> LLMEngine:
    cfg = EngineConfig(model=args.model, dtype=args.dtype, device=args.device, num_threads=args.threads, **kw)
    return LLMEngine(cfg, progress=stderr_progress)


def _hf(engine: LLMEngine):
    return hf_baseline.load_hf(engine.model_path, engine.dtype)


def _throughput(args) -> dict:
    engine = _engine(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     kv_cache_memory_bytes=args.kv_cache_mib * 2**20)
    reqs = mixed_workload(engine.tokenizer, args.num_chats, args.num_docs)
    runs.engine_throughput(engine, reqs[:2])  # warm-up
    ours = runs.engine_throughput(engine, reqs)
    out = {"workload": {"requests": len(reqs), "chats": args.num_chats, "documents": args.num_docs,
                        "prompt_tokens": sum(len(r.prompt_token_ids) for r in reqs),
                        "output_tokens": sum(r.max_tokens for r in reqs)},
           "inferlab": {**ours, "max_num_seqs": args.max_num_seqs,
                        "max_num_batched_tokens": args.max_num_batched_tokens}}
    if not args.no_baseline:
        model = _hf(engine)
        pad = engine.tokenizer.eos_token_id or 0
        hf_baseline.hf_generate_static(model, reqs[:2], 2, pad)  # warm-up
        hf = hf_baseline.hf_generate_static(model, reqs, args.hf_batch_size, pad)
        out["hf_transformers"] = {**hf, "batch_size": args.hf_batch_size}
        out["speedup"] = ours["output_tokens_per_s"] / hf["output_tokens_per_s"]
    return out


def _decode(args) -> dict:
    engine = _engine(args)
    prompt = corpus_tokens(engine.tokenizer)[: args.prompt_tokens]
    runs.engine_one_stream(engine, prompt, 8)  # warm-up
    ours = runs.engine_one_stream(engine, prompt, args.max_tokens)
    out = {"prompt_tokens": len(prompt), "max_tokens": args.max_tokens, "inferlab": _no_tokens(ours)}
    if not args.no_baseline:
        model = _hf(engine)
        hf_baseline.hf_one_stream(model, prompt, 8)  # warm-up
        hf = hf_baseline.hf_one_stream(model, prompt, args.max_tokens)
        out["hf_transformers"] = _no_tokens(hf)
        out["speedup_decode"] = ours["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
        out["speedup_end_to_end"] = hf["seconds"] / ours["seconds"]
        same = sum(a == b for a, b in zip(ours["tokens"], hf["tokens"]))
        out["greedy_tokens_agree"] = f"{same}/{args.max_tokens}"
    return out


def _no_tokens(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "tokens"}
