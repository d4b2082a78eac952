"""The bf16 weight-streaming kernel against 1-8 rows of x: ms per call and GB/s of weights read.

    python scripts/stream_rows_bench.py [--n 49152] [--k 576]        # the lm_head of SmolLM2-135M
    INFERLAB_CPU_TIER=avx2 python scripts/stream_rows_bench.py        # another tier's body on this CPU

One thread, the matrix on huge pages as the engine keeps its weights, median of 15 calls after 3."""
from __future__ import annotations

import argparse
import time

import torch

from engine.kernels import cpu_tier, stream_linear_kernel
from engine.runner import huge_pages


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=49152)
    p.add_argument("--k", type=int, default=576)
    args = p.parse_args()
    torch.set_num_threads(1)
    kernel = stream_linear_kernel()
    w = huge_pages.zeros((args.n, args.k), torch.bfloat16, torch.device("cpu"))
    w.copy_(torch.randn(args.n, args.k).bfloat16())
    for rows in (1, 2, 3, 4, 5, 6, 7, 8):
        x = torch.randn(rows, args.k).bfloat16()
        for _ in range(3):
            kernel.stream_linear_bf16(x, w, None)
        times = []
        for _ in range(15):
            t = time.perf_counter()
            kernel.stream_linear_bf16(x, w, None)
            times.append(time.perf_counter() - t)
        t = sorted(times)[len(times) // 2]
        print(f"{cpu_tier()}: {rows} rows: {t * 1e3:.2f} ms, {args.n * args.k * 2 / t / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
