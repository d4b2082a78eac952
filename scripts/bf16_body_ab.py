"""The bf16 walks of the weights (core/linear.h: tiles, rows, stream) against each other inside one decode
engine: the same weights, caches and fused step, the walk switched between alternating rounds (the module's
set_bf16_body), so only the walk differs. Prints per walk the median native-call time a step (median of the
rounds' medians) and the per-op times of the fused step's profile, with the load average.
    python scripts/bf16_body_ab.py [--threads 1] [--rounds 7] [--tokens 64] [--bodies rows,stream]
Alternating evens out slow drift only: run it at low load and say the load."""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--bodies", default="rows,stream")
    args = ap.parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.quant.quality import heldout_texts

    engine = LLMEngine(EngineConfig(model=args.model, dtype="bfloat16", quant_format="bf16",
                                    num_threads=args.threads))
    prompt = engine.tokenizer.encode(heldout_texts()[0])[:32]
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    engine.generate([prompt], params)  # warm-up: builds the plan
    runner = engine.runner
    module, run = runner.fused.kernel, runner.fused.run
    plan = runner.fused.plan(runner.kv_caches)
    times: list[float] = []

    def timed(*a):
        t0 = time.perf_counter()
        r = run(*a)
        times.append(time.perf_counter() - t0)
        return r

    runner.fused.run = timed
    bodies = args.bodies.split(",")
    medians = {b: [] for b in bodies}
    ops = {b: {} for b in bodies}
    loads = [open("/proc/loadavg").read().split()[0]]
    for _ in range(args.rounds):
        for b in bodies:
            module.set_bf16_body(b)
            times.clear()
            plan.set_profile(True)
            engine.generate([prompt], params)
            prof = plan.profile()
            n = prof.pop("steps")
            for k, v in prof.items():
                ops[b].setdefault(k, []).append(v / n * 1e3)
            medians[b].append(statistics.median(times) * 1e3)
    loads.append(open("/proc/loadavg").read().split()[0])
    print(f"{args.threads} thread(s), tier {module.tier()}, load {loads[0]} -> {loads[1]}, {args.rounds} rounds")
    base = statistics.median(medians[bodies[0]])
    for b in bodies:
        m = statistics.median(medians[b])
        by_time = sorted(ops[b].items(), key=lambda kv: -sum(kv[1]))
        per = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in by_time)
        print(f"{b:7s} native step median {m:.3f} ms ({m / base:.3f}x {bodies[0]}); per op ms: {per}")


if __name__ == "__main__":
    main()
