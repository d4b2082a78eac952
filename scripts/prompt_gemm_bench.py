"""Prompt rows of a quantized model two ways, side by side in one process: the many-rows route of
engine/quant/schemes.py (the dequantize-then-GEMM route where the CPU multiplies bf16 natively, else at 4 bits
the int8-activation kernel) against the exact weight-streaming kernels it replaces (every layer's
`prompt_gemm` turned off), taking turns. "route" in the JSON says which route ran.

    python scripts/prompt_gemm_bench.py [--quant-format int4 int8] [--threads 1] [--prompt-tokens 64 512] [--rounds 5]

One prompt of N tokens to its first token (a fresh prompt each time: no prefix-cache hit), medians of
alternating rounds, prefill tokens/s and the ratio. Prints JSON with the CPU, tier and load average.
Quiet machine; compare only ratios of one run."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quant-format", nargs="+", default=["int4", "int8"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.kernels import cpu_tier
    from engine.perf.probe import cpu_description
    from engine.quant.quality import heldout_texts
    from engine.quant.schemes import _native_bf16_gemm
    from engine.quant.weight_only import QuantLinear
    from engine.runner.cpu_compute import emulated_bf16_forced

    out = {"cpu": cpu_description()["model"], "tier": cpu_tier(), "threads": args.threads,
           "route": "dequantize + GEMM" if _native_bf16_gemm(emulated_bf16_forced())
           else "int8 activations",
           "load_average_before": os.getloadavg()[0], "runs": {}}
    text = " ".join(heldout_texts()) * 8
    once = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for fmt in args.quant_format:
        engine = LLMEngine(EngineConfig(model=args.model, quant_format=fmt, quant_embeddings=fmt == "int4",
                                        num_threads=args.threads))
        ids = engine.tokenizer.encode(text)
        layers = [m for m in engine.model.modules() if isinstance(m, QuantLinear) and m.prompt_gemm]
        for n in args.prompt_tokens:
            times: dict[str, list[float]] = {"route": [], "kernels": []}
            for r in range(args.rounds + 1):  # round 0 warms both up
                for i, route in enumerate(("route", "kernels") if r % 2 == 0 else ("kernels", "route")):
                    for m in layers:
                        m.prompt_gemm = route == "route"
                    start = (r * 2 + i) * 11 % max(1, len(ids) - n)
                    t = time.perf_counter()
                    engine.generate([ids[start:start + n]], once)
                    if r:
                        times[route].append(time.perf_counter() - t)
            for m in layers:
                m.prompt_gemm = True
            med = {k: statistics.median(v) for k, v in times.items()}
            out["runs"][f"{fmt}, {n} tokens"] = {
                "first_token_ms": {k: round(v * 1e3, 1) for k, v in med.items()},
                "prefill_tokens_per_s": {k: round(n / v, 1) for k, v in med.items()},
                "route_speedup": round(med["kernels"] / med["route"], 2)}
        del engine
    out["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
