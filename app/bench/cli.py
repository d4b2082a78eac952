"""`inferlab bench {throughput,decode} --json OUT`: side-by-side measurements in one run."""
from __future__ import annotations

import json
import platform
import sys
import time

import torch

import engine.kernels as kernels
from app.bench import bandwidth, hf_baseline, llama_cpp, llama_server, runs
from app.bench.background_load import background_load
from app.bench.rounds import (
    MODE_KNOBS,
    MODES,
    alternate,
    bench_engine,
    hf_model,
    kernels_used,
    median_run,
    memory_breakdown,
    record_modes,
    warm_up,
)
from app.load.workload import corpus_tokens
from app.result_file import write_or_print
from engine.kernels.tier_choice import family_for_format
from engine.perf.probe import cpu_description
from engine.quant.schemes import int4_layout_in_words, prompt_rows_in_words
from engine.quant_formats import DENSE, QUANT_FORMAT_NAMES
from engine.runner import huge_pages
from engine.runner.threads import choose_threads


def add_bench_args(p, engine_args) -> None:
    sub = p.add_subparsers(dest="bench", required=True)
    tp = sub.add_parser("throughput", help="mixed workload: inferlab vs HF generate in static batches")
    dec = sub.add_parser("decode", help="one stream: inferlab vs HF generate")
    bat = sub.add_parser("batch", help="batched decode, N streams: inferlab vs llama.cpp's llama-batched-bench")
    from app.record.args import add_record_args

    for q in (tp, dec):
        add_record_args(q, "one more run per mode, after the measured rounds (recording costs the engine thread's "
                           "time: the figures are from unrecorded rounds)")
    for q in (tp, dec, bat):
        engine_args(q)
        q.add_argument("--json", metavar="OUT", help="write the results here")
        q.add_argument("--no-baseline", action="store_true", help="skip the HF transformers baseline")
        q.add_argument("--modes", nargs="+", choices=list(MODE_KNOBS), default=list(MODES),
                       help="inferlab modes to measure (default: eager and compile; layers: eager without the "
                            "fused decode step; graphs: all-decode steps from CUDA graphs, --cuda-graphs)")
    tp.add_argument("--num-chats", type=int, default=36)
    tp.add_argument("--num-docs", type=int, default=12)
    tp.add_argument("--hf-batch-size", type=int, default=8)
    tp.add_argument("--max-num-seqs", type=int, default=64)
    tp.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget (offline: large)")
    tp.add_argument("--kv-cache-mib", type=int, default=1024)
    tp.add_argument("--rounds", type=int, default=1, help="alternate inferlab and HF rounds; medians compared")
    tp.add_argument("--max-output-tokens", type=int, default=256, help="outputs are 16 to this many tokens")
    tp.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp's llama-server even where it is built")
    tp.add_argument("--llama-parallel", type=int, default=16,
                    help="llama-server's parallel slots (-np, continuous batching) for the same requests")
    tp.add_argument("--llama-threads", type=int, default=None,
                    help="llama-server's threads (default: the engine's; on a busy machine its spinning threads "
                         "stall with more threads than free cores, see docs/llama-cpp.md)")
    dec.add_argument("--max-tokens", type=int, default=128)
    dec.add_argument("--prompt-tokens", type=int, default=32)
    dec.add_argument("--rounds", type=int, default=3, help="alternating inferlab / HF / llama.cpp rounds (median)")
    dec.add_argument("--quant-format", choices=QUANT_FORMAT_NAMES, default=DENSE,
                     help="weights: bf16, or a weight-only format (int4: the head in int8 too, as the Q4_1 GGUF's "
                          "Q8_0 table); llama.cpp runs the bf16 GGUF for bf16, the source GGUF for int4")
    dec.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even where it is built")
    bat.add_argument("--streams", type=int, nargs="+", default=[4, 8], help="streams decoding at once (default 4 8)")
    bat.add_argument("--prompt-tokens", type=int, default=32, help="each stream's own prompt")
    bat.add_argument("--max-tokens", type=int, default=64, help="tokens each stream generates")
    bat.add_argument("--rounds", type=int, default=3, help="alternating inferlab / llama.cpp rounds (median)")
    bat.add_argument("--quant-format", choices=QUANT_FORMAT_NAMES, default=DENSE,
                     help="weights (llama.cpp: the bf16 GGUF for bf16, the source GGUF for int4)")
    bat.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even where it is built")
    bat.add_argument("--invariance", action="store_true",
                     help="also run every round with batch invariance off (the library GEMM for prompt rows and "
                          "past 16 decode rows), alternating: what invariance costs")
    dec.add_argument("--tiers", nargs="+", choices=["portable", "avx2", "avx512", "neon"], default=[],
                     help="also run the engine's eager decode on these ISA tiers of the native kernels (each "
                          "its own engine, in the same alternating rounds); tiers this CPU cannot run are left out")
    dec.add_argument("--background-load", type=int, default=0, metavar="N",
                     help="run N busy processes during the measurement (a busy laptop); recorded in the JSON")
    qb = sub.add_parser("quant", help="the weight formats in one run: bytes, KV blocks, speed, quality")
    engine_args(qb)
    qb.add_argument("--json", metavar="OUT", help="write the results here")
    qb.add_argument("--quant-format", nargs="+", choices=QUANT_FORMAT_NAMES, default=list(QUANT_FORMAT_NAMES),
                    help="the formats, each measured against bf16 (default: all)")
    qb.add_argument("--group-size", type=int, default=32, choices=[32, 64, 128])
    qb.add_argument("--outliers", type=int, default=0, help="input channels per layer kept in 16 bits")
    qb.add_argument("--embeddings", action="store_true", help="also quantize the embedding table and lm_head")
    qb.add_argument("--streams", type=int, default=16)
    qb.add_argument("--max-tokens", type=int, default=64)
    qb.add_argument("--memory-budget-mib", type=int, default=1024, help="weights + KV budget")
    sp = sub.add_parser("spec", help="speculative decoding vs none at 1 and many streams, outputs checked")
    engine_args(sp)
    sp.add_argument("--json", metavar="OUT", help="write the results here")
    sp.add_argument("--k", type=int, default=4, help="draft length")
    sp.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    sp.add_argument("--workload", choices=["echo", "chat", "both"], default="both",
                    help="echo: answers that quote the prompt; chat: fresh questions")
    sp.add_argument("--max-tokens", type=int, default=64)
    sp.add_argument("--methods", nargs="*", help="subset of: ngram draft-int4-self mtp")
    from app.bench.serve_bench import add_serve_bench_args

    add_serve_bench_args(sub.add_parser("serve", help="goodput, p99 TTFT/TPOT vs arrival rate; policies; chunking"),
                         engine_args)
    from app.bench.lora_bench import add_lora_bench_args

    add_lora_bench_args(sub.add_parser("lora", help="multi-LoRA: base vs 1/4/16 adapters in the mix, ranks, merged"),
                        engine_args)
    from app.bench import host_bench, kv_bench, tradeoff_bench
    from app.gui import overhead_bench

    kv_bench.add_args(sub.add_parser("kv", help="16-bit vs 8-bit KV cache: blocks, quality, speed"), engine_args)

    tradeoff_bench.add_args(sub.add_parser("tradeoff", help="batch x weight format x draft sweep, frontier, roofline"),
                            engine_args)
    overhead_bench.add_args(sub.add_parser("gui", help="engine tokens/s headless vs with the window open"),
                          engine_args)
    host_bench.add_args(sub.add_parser("host", help="the engine's host work a decode step, the model made free "
                                                    "(1 / 8 / 64 streams, greedy and sampled)"), engine_args)


def run_bench(args) -> int:
    """Run one benchmark; a model that cannot load or a workload it cannot take is one error line (exit 2)."""
    import signal
    import threading

    from app.result_file import unwritable
    from engine.loading.errors import ModelLoadError

    if threading.current_thread() is threading.main_thread():  # SIGTERM unwinds, so the servers a bench
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # started are stopped
    bad = unwritable({"json": getattr(args, "json", None), "csv": getattr(args, "csv", None)})
    if bad:  # said before the bench, not after its minutes
        print(f"inferlab: error: bench {args.bench}: {bad}", file=sys.stderr)
        return 2
    try:
        return _run_bench(args)
    except (ValueError, ModelLoadError, llama_server.PeerError) as exc:
        print(f"inferlab: error: bench {args.bench}: {exc}", file=sys.stderr)
        return 2


def _run_bench(args) -> int:
    if args.bench == "serve" and getattr(args, "url", None):  # a server over HTTP: no engine, no torch here
        from app.bench.serve_url import run_url_bench

        return _emit(args, {"benchmark": "serve", "machine": platform.processor() or platform.machine(),
                            "time": time.strftime("%Y-%m-%d %H:%M:%S"), **run_url_bench(args)})
    if args.bench == "serve" and getattr(args, "peer", None):  # two servers as child processes, side by side
        from app.bench.serve_peer import run_peer_bench

        return _emit(args, {"benchmark": "serve", "peer": args.peer, "cpu": cpu_description(),
                            "machine": platform.processor() or platform.machine(),
                            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                            **run_peer_bench(args)})
    if args.bench == "gui" and args.threads is None:
        from app.device_args import engine_threads

        args.threads = engine_threads()  # as the app starts: the cores free now
    threads = choose_threads(args.threads)  # chosen before any background load starts
    args.threads = threads.count  # every engine of the bench runs this many
    torch.set_num_threads(threads.count)
    result = {"benchmark": args.bench, "model": args.model, "dtype": args.dtype, "device": args.device,
              "threads": torch.get_num_threads(), "threads_reason": threads.describe(),
              "machine": platform.processor() or platform.machine(), "cpu": cpu_description(),
              "int4_layout": int4_layout_in_words(),
              "quantized_prompt_rows": prompt_rows_in_words(), "torch": torch.__version__,
              "huge_pages": huge_pages.describe(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.bench == "throughput":
        from app.bench.throughput import run_throughput

        result.update(run_throughput(args))
    elif args.bench == "spec":
        from app.bench.spec_bench import run_spec_bench

        result.update(run_spec_bench(args))
    elif args.bench == "quant":
        from app.bench.quant_bench import run_quant_bench

        result.update(run_quant_bench(args))
    elif args.bench == "serve":
        from app.bench.serve_bench import run_serve_bench

        result.update(run_serve_bench(args))
    elif args.bench == "lora":
        from app.bench.lora_bench import run_lora_bench

        result.update(run_lora_bench(args))
    elif args.bench == "gui":
        from app.gui import overhead_bench

        result.update(overhead_bench.run(args))
    elif args.bench == "kv":
        from app.bench import kv_bench

        result.update(kv_bench.run(args))
    elif args.bench == "batch":
        from app.bench.batch_bench import run_batch_bench

        result.update(run_batch_bench(args))
    elif args.bench == "host":
        from app.bench import host_bench

        result.update(host_bench.run(args))
    elif args.bench == "tradeoff":
        from app.bench import tradeoff_bench

        result.update(tradeoff_bench.run(args))
    else:
        with background_load(args.background_load) as load:
            result["background_load"] = load
            result.update(_decode(args))
    # after the engines are built: the tiers were timed at the first build (engine/kernels/tier_choice.py)
    result["cpu_tier"] = kernels.describe_choice(family_for_format(getattr(args, "quant_format", DENSE)))
    result["kernel_tiers"] = kernels.choice_summary()
    return _emit(args, result)


def _engine_on_tier(args, tier: str, fmt: str):
    """An engine like the bench's whose native kernels are `tier`'s (INFERLAB_CPU_TIER while it is built)."""
    import os

    before = os.environ.get("INFERLAB_CPU_TIER")
    os.environ["INFERLAB_CPU_TIER"] = tier
    try:
        return bench_engine(args, quant_format=fmt, quant_embeddings=fmt == "int4")
    finally:
        if before is None:
            os.environ.pop("INFERLAB_CPU_TIER")
        else:
            os.environ["INFERLAB_CPU_TIER"] = before


def _emit(args, result: dict) -> int:
    text = json.dumps(result, indent=2)
    if args.json and not write_or_print(args.json, text, f"inferlab bench {args.bench}"):
        return 1  # the measurement is not lost: it went to stdout
    print(text)
    return 0


def _decode(args) -> dict:
    """One stream: HF, inferlab eager and inferlab with compile=True (dense code between attentions
    compiled), and llama.cpp's llama-bench on the same weights where it is built; medians over
    alternating rounds, and each side's share of the measured memory bandwidth (the roofline)."""
    fmt = getattr(args, "quant_format", DENSE)
    modes = tuple(getattr(args, "modes", MODES))
    engine = bench_engine(args, quant_format=fmt, quant_embeddings=fmt == "int4")
    prompt = corpus_tokens(engine.tokenizer)[: args.prompt_tokens]
    paths = warm_up(engine, lambda: runs.engine_one_stream(engine, prompt, args.max_tokens), modes)
    model = hf = None
    if not args.no_baseline:
        model = hf_model(engine)
        hf_baseline.hf_one_stream(model, prompt, 8)  # warm-up
        hf = lambda: hf_baseline.hf_one_stream(model, prompt, args.max_tokens)  # noqa: E731
    peer, peer_info = _llama_cpp_peer(args, engine, fmt)
    peers = {"llama.cpp": peer} if peer else {}
    tiers = [t for t in dict.fromkeys(getattr(args, "tiers", [])) if t in kernels.supported_tiers()
             and t != kernels.cpu_tier()]
    for tier in tiers:  # the same engine on another tier's kernels: its own engine, alternating with the rest
        other = _engine_on_tier(args, tier, fmt)
        runs.engine_one_stream(other, prompt, args.max_tokens)  # warm-up
        peers[f"tier:{tier}"] = lambda e=other: runs.engine_one_stream(e, prompt, args.max_tokens)
    ours_runs, hf_runs = alternate(engine, args.rounds,
                                   lambda: runs.engine_one_stream(engine, prompt, args.max_tokens), hf,
                                   peers or None, modes)
    peer_runs = ours_runs.pop("peer:llama.cpp", [])
    tier_runs = {t: ours_runs.pop(f"peer:tier:{t}") for t in tiers}
    ours = {m: median_run(r) for m, r in ours_runs.items()}
    out = {"prompt_tokens": len(prompt), "max_tokens": args.max_tokens, "rounds": args.rounds, "quant_format": fmt,
           "engine": engine.compute_line(), "kernels": kernels_used(engine), "memory": memory_breakdown(engine),
           "stream_linear": engine.config.stream_linear, "decode_step_path": paths,
           "inferlab_decode_tokens_per_s_each_round": {m: [r["decode_tokens_per_s"] for r in ours_runs[m]]
                                                       for m in modes}}
    for m in modes:
        out["inferlab" if m == "eager" else f"inferlab_{m}"] = _no_tokens(ours[m])
    out["llama_cpp"] = _peer_summary(peer_info, peer_runs, ours)
    if tiers:  # eager decode per ISA tier, medians of the same rounds; ratios against the engine's own tier
        own = ours.get("eager", next(iter(ours.values())))["decode_tokens_per_s"]
        out["tiers"] = {kernels.cpu_tier(): {"decode_tokens_per_s": own, "each_round": [
            r["decode_tokens_per_s"] for r in ours_runs.get("eager", [])]}}
        for t, r in tier_runs.items():
            med = median_run(r)["decode_tokens_per_s"]
            out["tiers"][t] = {"decode_tokens_per_s": med, "vs_own_tier": round(med / own, 3),
                               "each_round": [x["decode_tokens_per_s"] for x in r]}
    out["roofline"] = roofline_fractions(engine, len(prompt), args.max_tokens,
                                         {**{m: ours[m]["decode_tokens_per_s"] for m in modes},
                                          **({"llama.cpp": out["llama_cpp"]["decode_tokens_per_s"]}
                                             if peer_runs else {})})
    if model is not None:
        hf_res = median_run(hf_runs)
        out["hf_transformers"] = _no_tokens(hf_res)
        out["hf_decode_tokens_per_s_each_round"] = [r["decode_tokens_per_s"] for r in hf_runs]
        out["speedup_decode"] = {m: ours[m]["decode_tokens_per_s"] / hf_res["decode_tokens_per_s"] for m in modes}
        out["speedup_end_to_end"] = {m: hf_res["seconds"] / ours[m]["seconds"] for m in modes}
        out["greedy_tokens_agree"] = {m: f"{sum(a == b for a, b in zip(ours[m]['tokens'], hf_res['tokens']))}"
                                         f"/{args.max_tokens}" for m in modes}
    out["memory_bandwidth"] = bandwidth.decode_bandwidth(
        engine, {m: ours[m]["decode_tokens_per_s"] for m in modes},
        out.get("hf_transformers", {}).get("decode_tokens_per_s"))
    if getattr(args, "record", None):
        out["recording"] = record_modes(args, engine, modes, "bench decode", "one stream",
                                        lambda: runs.engine_one_stream(engine, prompt, args.max_tokens))
    return out


def _no_tokens(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "tokens"}


def _llama_cpp_peer(args, engine, fmt: str):
    """(one measured llama-bench run, what it runs) where llama.cpp is built and a GGUF of the same
    weights exists in this format; (None, {"skipped": why}) otherwise."""
    if getattr(args, "no_llama_cpp", True):
        return None, {"skipped": "--no-llama-cpp"}
    binary = llama_cpp.find_binary()
    if binary is None:
        return None, {"skipped": f"no llama-bench under {llama_cpp.llama_cpp_dir()} (scripts/build_llama_cpp.sh)"}
    try:
        gguf = llama_cpp.gguf_for_format(engine.model_path, fmt)
    except ValueError as exc:  # the conversion failed (e.g. its script's own needs are missing): said, not fatal
        return None, {"skipped": str(exc)}
    if gguf is None:
        return None, {"skipped": f"no GGUF of these weights in {fmt}"}
    threads = torch.get_num_threads()
    run = lambda: llama_cpp.llama_bench(binary, gguf, threads, args.max_tokens)  # noqa: E731
    run()  # warm-up: loads the file into the page cache
    return run, {"binary": str(binary), "build": llama_cpp.llama_cpp_build(), "gguf": str(gguf), "threads": threads,
                 "note": "llama-bench tg: decode from an empty context (inferlab: after a short prompt)"}


def _peer_summary(info: dict, peer_runs: list[dict], ours: dict) -> dict:
    if not peer_runs:
        return info
    med = median_run(peer_runs)
    return {**info, **med, "decode_tokens_per_s_each_round": [r["decode_tokens_per_s"] for r in peer_runs],
            "inferlab_over_llama_cpp": {m: ours[m]["decode_tokens_per_s"] / med["decode_tokens_per_s"]
                                        for m in ours}}


def roofline_fractions(engine, prompt_tokens: int, max_tokens: int, rates: dict[str, float]) -> dict:
    """Bytes one decode step reads (weights + KV at the mid-run context, engine/perf/step_cost.py)
    times each side's tokens/s, as a share of the probed memory bandwidth (engine/perf/probe.py)."""
    from engine.perf.probe import device_cache_bytes, probe_roofs
    from engine.perf.step_cost import RequestWork, step_cost
    from engine.perf.step_counter import model_shape

    shape = model_shape(engine.model, engine.model_config, torch.empty((), dtype=engine.dtype).element_size())
    step = step_cost(shape, [RequestWork(1, prompt_tokens + max_tokens // 2, 1)])
    roofs = probe_roofs(engine.device)  # the roofs of the device the engine runs on, not the host CPU's
    bw = roofs.bandwidth_bytes_per_s
    weights = shape.layer_weight_bytes + shape.lm_head_bytes
    return {"bytes_per_token": step.bytes_moved, "weight_bytes_per_token": weights,
            "probed_bandwidth_bytes_per_s": bw, "probe": roofs.how, "probed_at": roofs.measured_at,
            "last_level_cache_bytes": device_cache_bytes(engine.device),
            "weights_fit_in_last_level_cache": weights < device_cache_bytes(engine.device),
            "achieved_bandwidth_bytes_per_s": {k: step.bytes_moved * r for k, r in rates.items()},
            "fraction_of_probed_bandwidth": {k: step.bytes_moved * r / bw for k, r in rates.items()}}
