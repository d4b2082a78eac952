"""A whole decode step's time by the rows it carries: greedy generations of n prompts at once (n = 1-10),
the time of 41 tokens less the time of 1, per step, the median of 5 runs in alternating order, beside the
1-row step. What the chapters that batch or draft pay per extra row (continuous batching, speculative,
multi-token). The model and threads as the app runs them:

    python scripts/step_rows_bench.py [--threads T]
    INFERLAB_CPU_TIER=avx2 INFERLAB_EMULATED_BF16=1 python scripts/step_rows_bench.py   # as an AVX2 CPU

Ratios from one run only (the machine's speed drifts); quiet machine, say its load."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import EngineConfig, LLMEngine, SamplingParams

ROWS = (1, 2, 3, 4, 5, 6, 8, 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    eng = LLMEngine(EngineConfig(model=args.model, max_num_seqs=max(ROWS), num_threads=args.threads))
    print(eng.compute.describe())
    prompts = [f"Story number {i}: once upon a time there was" for i in range(max(ROWS))]

    def run(n: int, tokens: int) -> float:
        sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        t = time.perf_counter()
        eng.generate(prompts[:n], sp)
        return time.perf_counter() - t

    for n in ROWS:  # warm-up
        run(n, 8)
    per_step: dict[int, list[float]] = {n: [] for n in ROWS}
    for rep in range(5):
        for n in (ROWS if rep % 2 else ROWS[::-1]):
            per_step[n].append((run(n, 41) - run(n, 1)) / 40)
    one = statistics.median(per_step[1])
    for n in ROWS:
        m = statistics.median(per_step[n])
        print(f"{n:2d} rows  {m * 1e3:6.2f} ms a step  {m / one:4.2f}x one row's  {n / (m / one):4.2f}x its tokens/s")


if __name__ == "__main__":
    main()
