"""Decode speed with the weights on huge pages and without, side by side in one process.

    python scripts/huge_pages_bench.py [--quant-format bf16 int4] [--threads 1] [--tokens 64] [--rounds 5]

Two engines on the same weights, one built with INFERLAB_HUGE_PAGES=0 (torch's own allocation), one
without (engine/runner/huge_pages.py); they take turns, one greedy stream each round. Prints tok/s per
round, the medians and their ratio, the CPU, its kernel tier and the load average, as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quant-format", nargs="+", default=["bf16", "int4"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.kernels import cpu_tier
    from engine.runner.huge_pages import huge_page_bytes_in_use, thp_mode

    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    out = {"cpu": platform.processor() or platform.machine(), "tier": cpu_tier(), "thp": thp_mode(),
           "threads": args.threads, "tokens": args.tokens, "runs": []}
    for fmt in args.quant_format:
        engines = {}
        for side, flag in (("4k_pages", "0"), ("huge_pages", "1")):
            os.environ["INFERLAB_HUGE_PAGES"] = flag
            before = huge_page_bytes_in_use() or 0
            engines[side] = LLMEngine(EngineConfig(model=args.model, quant_format=fmt, num_threads=args.threads))
            engines[side].generate(["Hello"], params)  # warm-up (and the kernels, built once)
            print(side, fmt, ": +", ((huge_page_bytes_in_use() or 0) - before) >> 20, "MiB on huge pages")
        rates = {side: [] for side in engines}
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(engines)[::-1]
            for side in order:
                t = time.perf_counter()
                engines[side].generate(["The history of the city"], params)
                rates[side].append(args.tokens / (time.perf_counter() - t))
        med = {side: statistics.median(v) for side, v in rates.items()}
        run = {"quant_format": fmt, "tok_s": {s: [round(x, 1) for x in v] for s, v in rates.items()},
               "median_tok_s": {s: round(v, 1) for s, v in med.items()},
               "ratio_huge_over_4k": round(med["huge_pages"] / med["4k_pages"], 3),
               "load_average": os.getloadavg()[0]}
        print(json.dumps(run))
        out["runs"].append(run)
        del engines
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
