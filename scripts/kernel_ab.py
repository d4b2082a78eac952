"""Two builds of the native kernels side by side in one process: the bf16 weight-streaming product against
1-8 rows of x, over a model's worth of matrices (SmolLM2-135M's 30 layers' shapes and its lm_head, on huge
pages, so the weights come from memory as in a decode step), the builds taking turns sweep by sweep.

    python scripts/kernel_ab.py A.so B.so [--reps 24]

Each .so is one tier's build from torch's extension cache (~/.cache/torch_extensions/<py>_cpu/
inferlab_kernels_<tier>_<hash of sources and flags>/): build one, change the source, build again (any engine start or
`python -c "from engine.kernels import stream_linear_kernel; stream_linear_kernel()"`), then compare. On a
shared machine only ratios from one run mean anything; the minimum over the sweeps is the least disturbed."""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

from engine.runner import huge_pages

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # qkv, o, gate_up, down of one layer


def _load(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _matrix(n: int, k: int) -> torch.Tensor:
    w = huge_pages.zeros((n, k), torch.bfloat16, torch.device("cpu"))
    return w.copy_(torch.randn(n, k).bfloat16())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--reps", type=int, default=24)
    args = p.parse_args()
    torch.set_num_threads(1)
    mods = [_load(args.a), _load(args.b)]
    mats = [_matrix(n, k) for _ in range(30) for n, k in SHAPES] + [_matrix(49152, 576)]
    for rows in range(1, 9):
        xs = {k: torch.randn(rows, k).bfloat16() for k in {w.shape[1] for w in mats}}
        times: list[list[float]] = [[], []]
        for rep in range(args.reps):
            for j in ((0, 1) if rep % 2 == 0 else (1, 0)):
                t = time.perf_counter()
                for w in mats:
                    mods[j].stream_linear_bf16(xs[w.shape[1]], w, None)
                times[j].append(time.perf_counter() - t)
        (a, b), (amin, bmin) = ([statistics.median(t) * 1e3 for t in times], [min(t) * 1e3 for t in times])
        print(f"{rows} rows: median A {a:.2f} B {b:.2f} ms (B/A {b / a:.3f}) | min A {amin:.2f} B {bmin:.2f} "
              f"(B/A {bmin / amin:.3f})", flush=True)


if __name__ == "__main__":
    main()
