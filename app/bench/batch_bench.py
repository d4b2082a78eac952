"""`inferlab bench batch`: batched decode, N streams at once, inferlab against llama.cpp's
llama-batched-bench on the same weights, in alternating rounds.

Both sides do the same work per stream count N: N sequences, each with its own prompt of P tokens (no
shared prefix: the prefix cache is emptied before each round, llama-batched-bench runs without -pps),
then T generated tokens each. The figure compared is decode tokens/s over all N streams, taken from the
moment every stream has its first token to the last token (llama-batched-bench's S_TG: N*T / t_tg).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from app.bench import llama_cpp
from app.bench.rounds import bench_engine, median_run
from app.load.workload import corpus_tokens
from app.managed.child import LLAMA_CPP_CRASH_RETRY, crash_retry_note
from engine import LLMEngine, SamplingParams
from engine.drive import drive

BATCHED = "llama-batched-bench"


def engine_batch(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict:
    """Every prompt at once; decode tokens/s from the last first token to the end (the prefill excluded)."""
    engine.block_manager.reset_prefix_cache()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    first: dict[str, float] = {}

    def stamp_first(outputs) -> None:
        for out in outputs:
            if out.new_token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter()

    drive(engine, on_outputs=stamp_first)
    end = time.perf_counter()
    decode_start = max(first[i] for i in ids)
    # tokens after each stream's first one, counted from the moment the last stream got its first
    produced_after = len(prompts) * (max_tokens - 1)
    return {"seconds": end - t0, "prefill_seconds": decode_start - t0,
            "decode_tokens_per_s": produced_after / max(end - decode_start, 1e-9)}


def batched_bench(binary: Path, gguf: Path, threads: int, streams: int, n_prompt: int, n_gen: int) -> dict:
    """One llama-batched-bench run (-npl streams, its own prompt per stream, jsonl): its S_TG. Where it dies
    of a signal it runs once more without weight repacking (`--no-repack`; llama.cpp 0.3.36 built without
    scripts/build_llama_cpp.sh's AMX patch segfaulted with repacked Q4_1 on a Sapphire Rapids Xeon), and the
    result says so."""
    ctx = streams * (n_prompt + n_gen) + 64
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", str(streams), "--output-format", "jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    note = None
    if proc.returncode < 0:
        note = crash_retry_note(BATCHED, -proc.returncode)
        cmd.extend(LLAMA_CPP_CRASH_RETRY)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{BATCHED} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not rows:
        raise RuntimeError(f"{BATCHED} printed no result: {proc.stdout[-400:]}")
    row = rows[-1]
    return {"command": " ".join(cmd), "decode_tokens_per_s": float(row["speed_tg"]),
            "prefill_tokens_per_s": float(row["speed_pp"]), **({"note": note} if note else {})}


def run_batch_bench(args) -> dict:
    fmt = args.quant_format
    streams = sorted(set(args.streams))
    engine = bench_engine(args, quant_format=fmt, quant_embeddings=fmt == "int4", max_num_seqs=max(streams),
                          max_num_batched_tokens=max(512, max(streams) * args.prompt_tokens))
    corpus = corpus_tokens(engine.tokenizer)
    prompts = [corpus[i * args.prompt_tokens:(i + 1) * args.prompt_tokens] for i in range(max(streams))]
    peer, peer_info = _peer(args, engine, fmt)
    out: dict = {"quant_format": fmt, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                 "rounds": args.rounds, "llama_cpp": peer_info, "streams": {}}
    for n in streams:
        engine_batch(engine, prompts[:n], 8)  # warm-up (and a first fused step of this width)
        failed = None
        if peer:
            try:
                peer(n)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:  # ours are still measured
                failed = str(exc)
        ours, theirs, variant = [], [], []
        for _ in range(args.rounds):  # alternating: both sides see the same drift of a shared machine
            ours.append(engine_batch(engine, prompts[:n], args.max_tokens))
            if peer and failed is None:
                theirs.append(peer(n))
            if getattr(args, "invariance", False):
                variant.append(_not_invariant(engine, prompts[:n], args.max_tokens))
        row = {"inferlab": {**median_run(ours), "each_round": [r["decode_tokens_per_s"] for r in ours]},
               "decode_step_path": engine.runner.last_path}
        if variant:
            row.update(_invariance_cost(ours, variant))
        if failed is not None:
            row["llama_cpp"] = {"failed": failed}
        elif theirs:
            med = median_run(theirs)
            row["llama_cpp"] = {**med, "each_round": [r["decode_tokens_per_s"] for r in theirs]}
            row["inferlab_over_llama_cpp"] = row["inferlab"]["decode_tokens_per_s"] / med["decode_tokens_per_s"]
        out["streams"][str(n)] = row
    return out


def _not_invariant(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict:
    """One round with EngineConfig.batch_invariant off (the library GEMM for prompt rows and past 16 decode
    rows), then back on."""
    engine.reconfigure(batch_invariant=False)  # applied at the round's first step
    try:
        return engine_batch(engine, prompts, max_tokens)
    finally:
        engine.reconfigure(batch_invariant=True)


def _invariance_cost(invariant: list[dict], variant: list[dict]) -> dict:
    """Medians of the rounds with batch invariance off, and on / off for decode tokens/s and for the time to
    every stream's first token (the prompts' prefill), each the ratio of its own medians."""
    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    ratio = {k: round(med(invariant, k) / med(variant, k), 3) for k in ("decode_tokens_per_s", "prefill_seconds")}
    return {"inferlab_not_invariant": {"decode_tokens_per_s": med(variant, "decode_tokens_per_s"),
                                       "prefill_seconds": med(variant, "prefill_seconds"),
                                       "each_round": [r["decode_tokens_per_s"] for r in variant],
                                       "prefill_each_round": [r["prefill_seconds"] for r in variant]},
            "inferlab_prefill_seconds": med(invariant, "prefill_seconds"),
            "inferlab_prefill_each_round": [r["prefill_seconds"] for r in invariant],
            "invariant_over_not": ratio}


def _peer(args, engine, fmt: str):
    if args.no_llama_cpp:
        return None, {"skipped": "--no-llama-cpp"}
    binary = llama_cpp.find_binary(BATCHED)
    if binary is None:
        return None, {"skipped": f"no {BATCHED} under {llama_cpp.llama_cpp_dir()} (scripts/build_llama_cpp.sh)"}
    try:
        gguf = llama_cpp.gguf_for_format(engine.model_path, fmt)
    except ValueError as exc:  # the conversion failed (its script's own needs missing): said, not fatal
        return None, {"skipped": str(exc)}
    if gguf is None:
        return None, {"skipped": f"no GGUF of these weights in {fmt}"}
    threads = torch.get_num_threads()
    return (lambda n: batched_bench(binary, gguf, threads, n, args.prompt_tokens, args.max_tokens),
            {"binary": str(binary), "build": llama_cpp.llama_cpp_build(), "gguf": str(gguf), "threads": threads})
