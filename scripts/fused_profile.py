"""Where one decode step of the fused path goes: per-op wall time inside the native step (the C++
timers of engine/kernels/fused_decode.cpp), the whole native call, and the runner's Python
around it, over a one-stream generation of SmolLM2-135M (or --model).
    python scripts/fused_profile.py [--quant-format int4] [--threads 2] [--tokens 64] [--int8-activations 0|1]
Medians are not possible per op (the timers sum); run it at low load (`uptime`)."""
from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quant-format", choices=["bf16", "int8", "fp8-e4m3", "int4"], default="int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--int8-activations", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.quant.quality import heldout_texts

    engine = LLMEngine(EngineConfig(model=args.model, dtype="bfloat16", quant_format=args.quant_format,
                                    quant_embeddings=args.quant_format == "int4", num_threads=args.threads,
                                    int8_activations=bool(args.int8_activations)))
    prompt = engine.tokenizer.encode(heldout_texts()[0])[:32]
    p = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    engine.generate([prompt], p)  # warm-up (builds the plan)
    runner = engine.runner
    native, steps = [], []
    run, execute = runner.fused.run, runner.execute

    def timed_run(*a):
        t0 = time.perf_counter()
        r = run(*a)
        native.append(time.perf_counter() - t0)
        return r

    def timed_execute(*a):
        t0 = time.perf_counter()
        r = execute(*a)
        if runner.last_path == "fused":
            steps.append(time.perf_counter() - t0)
        return r

    runner.fused.run, runner.execute = timed_run, timed_execute
    plan = runner.fused.plan(runner.kv_caches)
    plan.set_profile(True)
    t0 = time.perf_counter()
    engine.generate([prompt], p)
    wall = time.perf_counter() - t0
    prof = plan.profile()
    n = prof.pop("steps")
    ops = {k: v / n * 1e3 for k, v in sorted(prof.items(), key=lambda kv: -kv[1])}
    med = lambda xs: sorted(xs)[len(xs) // 2] * 1e3  # noqa: E731
    out = {"quant_format": args.quant_format, "threads": args.threads, "int8_activations": bool(args.int8_activations),
           "fused_steps": int(n), "ms_per_step_by_op_mean": ops, "native_call_ms_median": med(native),
           "runner_execute_ms_median": med(steps), "generate_tokens_per_s": args.tokens / wall}
    for k, v in ops.items():
        print(f"{k:22s} {v:7.3f} ms")
    print(f"sum of ops {sum(ops.values()):.3f} ms; native call median {out['native_call_ms_median']:.3f} ms; "
          f"runner.execute median {out['runner_execute_ms_median']:.3f} ms; {out['generate_tokens_per_s']:.1f} tok/s "
          f"end to end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
