"""Per-shape timing of the native matrix-vector kernels at one row (decode), SmolLM2-135M's shapes by
default: the share of a decode step each Linear takes (x 30 layers), and its achieved read bandwidth.
    python scripts/matvec_bench.py [--threads 2] [--repeats 200]
Weights are random; every call reads its weight (the layers together exceed L2, as in a real step)."""
from __future__ import annotations

import argparse
import time

import torch

SHAPES = {"qkv_proj": (960, 576), "o_proj": (576, 576), "gate_up_proj": (3072, 576), "down_proj": (576, 1536)}
HEAD = (49152, 576)
LAYERS = 30


def _median_pass(calls, passes: int) -> float:
    """Seconds per call: the median over `passes` passes through all the calls (the machine is shared:
    a pass a neighbour's process preempted is an outlier the median drops)."""
    for c in calls:
        c()
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for c in calls:
            c()
        times.append((time.perf_counter() - t0) / len(calls))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=31)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from engine.kernels import stream_linear_kernel
    from engine.quant.embeddings import int8_rows
    from engine.quant.weight_only import QuantLinear

    k = stream_linear_kernel()
    g = torch.Generator().manual_seed(0)
    total = {}
    for bits in (16, 4, "4q8"):
        for name, (n, kk) in SHAPES.items():
            ws = [torch.randn(n, kk, generator=g).bfloat16() for _ in range(LAYERS)]  # 30 layers' worth: from L3
            x = torch.randn(1, kk, generator=g).bfloat16()
            if bits == 16:
                calls = [lambda w=w, x=x: k.stream_linear_bf16(x, w, None) for w in ws]
                nbytes = n * kk * 2
            else:
                qs = [QuantLinear(w, None, 4, 32) for w in ws]
                calls = [lambda q=q, x=x: k.stream_linear_int4(x, q.codes, q.scale_zero, 32, None) for q in qs]
                if bits == "4q8":  # int8 activations, VNNI integer dot products
                    calls = [lambda q=q, x=x: k.stream_linear_int4_q8(x, q.codes, q.scale_zero, 32) for q in qs]
                nbytes = n * kk // 2 + n * kk // 32 * 4
            dt = _median_pass(calls, args.repeats)
            total[(bits, name)] = dt
            print(f"{bits:>3} bits {name:13s} ({n}x{kk}) {dt * 1e6:8.1f} us  x{LAYERS} = {dt * LAYERS * 1e3:6.2f} ms"
                  f"  {nbytes / dt / 1e9:5.1f} GB/s")
    w = torch.randn(*HEAD, generator=g)
    q, s = int8_rows(w, torch.bfloat16)
    x = torch.randn(1, HEAD[1], generator=g).bfloat16()
    for label, fn in (("  8", lambda: k.stream_linear_int8(x, q, s, None)),
                      ("8q8", lambda: k.stream_linear_int8_q8(x, q, s))):
        dt = _median_pass([fn], args.repeats)
        print(f"{label} bits lm_head      ({HEAD[0]}x{HEAD[1]}) {dt * 1e3:8.2f} ms  {q.numel() / dt / 1e9:5.1f} GB/s")
    for bits in (16, 4, "4q8"):
        layers = sum(v for (b, _), v in total.items() if b == bits) * LAYERS
        print(f"{bits} bits: the Linear layers of {LAYERS} layers {layers * 1e3:.2f} ms (+ the head)")


if __name__ == "__main__":
    main()
