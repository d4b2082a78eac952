"""`inferlab bench throughput`: the mixed workload through inferlab (--modes; by default eager and
compile=True), HF transformers in static batches and llama.cpp's llama-server where it is built, in
alternating rounds."""
from __future__ import annotations

import contextlib
import statistics
import sys

import torch

from app.bench import bandwidth, hf_baseline, llama_server, runs
from app.bench.rounds import (
    MODES,
    alternate,
    bench_engine,
    hf_model,
    kernels_used,
    median_run,
    memory_breakdown,
    warm_up,
)
from app.load.workload import mixed_workload


def run_throughput(args) -> dict:
    with contextlib.ExitStack() as stack:  # stops llama-server, where one was started, however this ends
        return _throughput_with(args, stack)


def _throughput_with(args, stack: contextlib.ExitStack) -> dict:
    engine = bench_engine(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          kv_cache_memory_bytes=args.kv_cache_mib * 2**20)
    reqs = mixed_workload(engine.tokenizer, args.num_chats, args.num_docs,
                          output=(min(16, args.max_output_tokens), args.max_output_tokens))
    modes = tuple(getattr(args, "modes", MODES))
    warm_up(engine, lambda: runs.engine_throughput(engine, reqs[:16]), modes)
    model = hf = None
    if not args.no_baseline:
        model = hf_model(engine)
        pad = engine.tokenizer.eos_token_id or 0
        hf_baseline.hf_generate_static(model, reqs[:2], 2, pad)  # warm-up
        hf = lambda: hf_baseline.hf_generate_static(model, reqs, args.hf_batch_size, pad)  # noqa: E731
    peer, peer_info = (None, {"skipped": "--no-llama-cpp"}) if args.no_llama_cpp else llama_server.throughput_peer(
        engine.model_path, reqs, args.llama_threads or torch.get_num_threads(), args.llama_parallel, stack)
    # each ours-round starts with a cold prefix cache (runs.engine_throughput resets it)
    ours_runs, hf_runs = alternate(engine, args.rounds, lambda: runs.engine_throughput(engine, reqs), hf,
                                   {"llama.cpp": peer} if peer else None, modes)
    peer_runs = ours_runs.pop("peer:llama.cpp", [])
    if peer:
        peer_info["inferlab_dtype"] = str(engine.dtype).removeprefix("torch.")
    key = "output_tokens_per_s"
    out = {"workload": {"requests": len(reqs), "chats": args.num_chats, "documents": args.num_docs,
                        "prompt_tokens": sum(len(r.prompt_token_ids) for r in reqs),
                        "output_tokens": sum(r.max_tokens for r in reqs)},
           "rounds": args.rounds, "max_num_seqs": args.max_num_seqs, "kernels": kernels_used(engine),
           "memory": memory_breakdown(engine),
           "max_num_batched_tokens": args.max_num_batched_tokens,
           "inferlab": {m: {**median_run(r, key), f"{key}_each_round": [x[key] for x in r],
                            f"{key}_median": statistics.median(x[key] for x in r)} for m, r in ours_runs.items()}}
    if model is not None:
        hf_med = statistics.median(x[key] for x in hf_runs)
        out["hf_transformers"] = {**median_run(hf_runs, key), "batch_size": args.hf_batch_size,
                                  f"{key}_each_round": [x[key] for x in hf_runs], f"{key}_median": hf_med}
        out["speedup"] = {m: out["inferlab"][m][f"{key}_median"] / hf_med for m in modes}
        out["speedup_each_round"] = {m: [a[key] / b[key] for a, b in zip(r, hf_runs)] for m, r in ours_runs.items()}
    out["llama_cpp"] = _throughput_peer_summary(peer_info, peer_runs, out["inferlab"], key)
    out["memory_bandwidth"] = bandwidth.batch_bandwidth(
        engine, {m: median_run(r, key) for m, r in ours_runs.items()})
    _print_throughput(out, key)
    return out


def _throughput_peer_summary(info: dict, peer_runs: list[dict], ours: dict, key: str) -> dict:
    if not peer_runs:
        return info
    med = statistics.median(r[key] for r in peer_runs)
    return {**info, **median_run(peer_runs, key), f"{key}_each_round": [r[key] for r in peer_runs],
            f"{key}_median": med, "inferlab_over_llama_cpp": {m: o[f"{key}_median"] / med for m, o in ours.items()}}


def _print_throughput(out: dict, key: str) -> None:
    """The medians as a small table on stderr (the JSON on stdout stays machine-readable)."""
    rows = [(f"inferlab {m}", o[f"{key}_median"]) for m, o in out["inferlab"].items()]
    for name, side in (("HF transformers static", out.get("hf_transformers")), ("llama.cpp llama-server",
                                                                                 out["llama_cpp"])):
        if side and f"{key}_median" in side:
            rows.append((name, side[f"{key}_median"]))
    print(f"mixed workload, {out['workload']['requests']} requests, median of {out['rounds']} round(s):",
          file=sys.stderr)
    for name, rate in rows:
        print(f"  {name:<26} {rate:8.1f} output tok/s", file=sys.stderr)
    for mode, ratio in out.get("speedup", {}).items():
        print(f"  inferlab {mode} / HF: {ratio:.2f}x", file=sys.stderr)
    for mode, ratio in out["llama_cpp"].get("inferlab_over_llama_cpp", {}).items():
        print(f"  inferlab {mode} / llama.cpp: {ratio:.2f}x", file=sys.stderr)
    if "skipped" in out["llama_cpp"]:
        print(f"  llama.cpp skipped: {out['llama_cpp']['skipped']}", file=sys.stderr)
