"""The int4 chunk and tiles layouts side by side in one process, on this CPU's kernel tier (or the one
INFERLAB_CPU_TIER forces):

    python scripts/int4_layout_bench.py [--threads 1] [--tokens 64] [--rounds 5] [--streams 1 4]
    INFERLAB_CPU_TIER=avx2 python scripts/int4_layout_bench.py      # the AVX2 bodies

1. One gate_up matrix (3072 x 576, groups of 32) from cache, 1-8 and 64 rows of x, both products (float
   activations, int8 activations), medians of alternating repeats: the bodies' compute alone.
2. Two 4-bit engines on the same weights, one per layout (INFERLAB_INT4_LAYOUT while each is built), taking
   turns: greedy decode of `streams` prompts at once, tok/s per round, medians and their ratio.
Prints JSON with the CPU, the tier and the load average. Quiet machine; compare only ratios of one run."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

LAYOUTS = ("chunks", "tiles")


def products(kernel, repeats: int = 7) -> dict:
    from engine.quant.weight_only import QuantLinear

    torch.manual_seed(0)
    w = (torch.randn(3072, 576) * 0.05).bfloat16()
    lay = {name: QuantLinear(w, None, 4, 32, int4_layout=name) for name in LAYOUTS}
    c, tl = lay["chunks"], lay["tiles"]
    calls = {
        ("chunks", "float"): lambda x: kernel.stream_linear_int4(x, c.codes, c.scale_zero, 32, None),
        ("tiles", "float"): lambda x: kernel.stream_linear_int4_tiles(x, tl.codes, tl.scale_zero, 32, None),
        ("chunks", "int8"): lambda x: kernel.stream_linear_int4_q8(x, c.codes, c.scale_zero, 32),
        ("tiles", "int8"): lambda x: kernel.stream_linear_int4_tiles_q8(x, tl.codes, tl.scale_zero, 32),
    }
    out = {}
    for rows in (1, 2, 4, 8, 64):
        x = torch.randn(rows, 576).bfloat16()
        times: dict = {key: [] for key in calls if not (key[1] == "int8" and rows > 8)}
        reps = max(1, 256 // rows)
        for r in range(repeats):
            for key in (list(times) if r % 2 == 0 else list(times)[::-1]):
                t = time.perf_counter()
                for _ in range(reps):
                    calls[key](x)
                times[key].append((time.perf_counter() - t) / reps * 1e3)
        for act in ("float", "int8"):
            if ("tiles", act) in times:
                ms = {name: statistics.median(times[(name, act)]) for name in LAYOUTS}
                ratio = round(ms["tiles"] / ms["chunks"], 3)
                out[f"{rows} rows, {act} activations"] = {"ms": {k: round(v, 4) for k, v in ms.items()},
                                                          "tiles_over_chunks_time": ratio}
    return out


def engines(args) -> list[dict]:
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.quant.schemes import INT4_LAYOUT_ENV

    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    built = {}
    for name in LAYOUTS:
        os.environ[INT4_LAYOUT_ENV] = name
        built[name] = LLMEngine(EngineConfig(model=args.model, quant_format="int4", quant_embeddings=True,
                                             num_threads=args.threads, max_num_seqs=max(args.streams)))
        built[name].generate(["Hello"], params)  # warm-up
    os.environ.pop(INT4_LAYOUT_ENV)
    prompts = [f"The history of the city number {i}" for i in range(max(args.streams))]
    runs = []
    for streams in args.streams:
        rates: dict = {name: [] for name in LAYOUTS}
        for r in range(args.rounds):
            for name in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
                t = time.perf_counter()
                built[name].generate(prompts[:streams], params)
                rates[name].append(streams * args.tokens / (time.perf_counter() - t))
        med = {k: statistics.median(v) for k, v in rates.items()}
        runs.append({"streams": streams, "tok_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
                     "median_tok_s": {k: round(v, 1) for k, v in med.items()},
                     "tiles_over_chunks": round(med["tiles"] / med["chunks"], 3), "load_average": os.getloadavg()[0]})
        print(json.dumps(runs[-1]))
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from engine.kernels import cpu_tier, stream_linear_kernel

    out = {"cpu": platform.processor() or platform.machine(), "tier": cpu_tier(), "threads": args.threads,
           "load_average_before": os.getloadavg()[0], "products_hot": products(stream_linear_kernel()),
           "decode": engines(args)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
