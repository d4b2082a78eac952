"""The fused decode step of this checkout against the same step built from another checkout's kernel
sources (A/B), in one process on one engine, in alternating rounds: the two builds read the same weights
and caches, so only the kernels differ. Prints the median native-call time per step of each (median
of the rounds' medians), the 10th percentile over all steps, and their ratios.
    python scripts/fused_ab.py --other /work/main/engine/kernels [--quant-format int4] [--threads 2]
        [--rounds 7] [--tokens 64] [--rows 1] [--json OUT]
Run it at low load (`uptime`): the machine is shared, and alternating rounds only even out slow drift."""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path


def load_other(src: Path, threads: int):
    """The fused-decode module built from the kernel sources in `src` (a kernels folder)."""
    from torch.utils.cpp_extension import load

    files = sorted([*src.glob("*.cpp"), *src.glob("*.h"), *(src / "core").glob("*.h")])  # the module's sources
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files))
    return load(name=f"inferlab_fused_decode_other_{digest.hexdigest()[:10]}", sources=[str(src / "module.cpp")],
                extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


class _Compat:
    """An older build's plan, whose step returns (hidden, logits): the greedy tokens are added by torch
    (inside the timed call, so the older build pays for what this one does in its step)."""

    def __init__(self, plan) -> None:
        self.plan = plan

    def __getattr__(self, name):
        return getattr(self.plan, name)

    def step(self, *a):
        import torch

        out = self.plan.step(*a)
        if len(out) == 3:
            return out
        hidden, logits = out
        greedy = torch.where(torch.isfinite(logits).all(-1), logits.argmax(-1), -1)
        return hidden, logits, greedy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="the kernels folder to compare with (B)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quant-format", choices=["bf16", "int8", "fp8-e4m3", "int4"], default="int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1, help="streams decoded together (1..8)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.quant.quality import heldout_texts

    engine = LLMEngine(EngineConfig(model=args.model, dtype="bfloat16", quant_format=args.quant_format,
                                    quant_embeddings=args.quant_format == "int4", num_threads=args.threads))
    runner = engine.runner
    kernels = {"this": runner.fused.kernel, "other": load_other(Path(args.other), args.threads)}
    if hasattr(kernels["other"], "set_bf16_body"):  # the same walk of bf16 weights as this build's (tier choice)
        kernels["other"].set_bf16_body(kernels["this"].bf16_body())
    texts = heldout_texts()
    prompts = [engine.tokenizer.encode(texts[i % len(texts)])[:32] for i in range(args.rows)]
    p = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    native: list[float] = []
    run = runner.fused.run

    def timed_run(*a):
        t0 = time.perf_counter()
        r = run(*a)
        native.append(time.perf_counter() - t0)
        return r

    runner.fused.run = timed_run
    make = runner.fused._make

    def make_compat(*a):  # a step of an older build returns (hidden, logits): add the greedy tokens
        plan = make(*a)
        return plan if runner.fused.kernel is kernels["this"] else _Compat(plan)

    runner.fused._make = make_compat
    per: dict[str, list[float]] = {k: [] for k in kernels}
    steps: dict[str, list[float]] = {k: [] for k in kernels}  # every counted step (ms)
    tokens: dict[str, list] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms both up (plan, page cache) and is not counted
        for name, kernel in kernels.items():
            runner.fused.kernel = kernel
            runner.fused.invalidate()
            native.clear()
            outs = engine.generate(prompts, p)
            if runner.last_path != "fused":
                raise SystemExit(f"the fused step did not run ({runner.fused.unsupported})")
            tokens[name] = [o.token_ids for o in outs]
            if rnd:
                per[name].append(statistics.median(native) * 1e3)
                steps[name] += [t * 1e3 for t in native]
    med = {k: statistics.median(v) for k, v in per.items()}
    # The 10th percentile of all steps: on a shared machine the fastest steps are the ones no other
    # process interrupted, a steadier figure than the median when the load is high.
    p10 = {k: statistics.quantiles(v, n=10)[0] for k, v in steps.items()}
    out = {"quant_format": args.quant_format, "threads": args.threads, "rows": args.rows, "rounds": args.rounds,
           "native_call_ms_median_each_round": per, "native_call_ms_median": med,
           "speedup_this_over_other": med["other"] / med["this"],
           "native_call_ms_p10_all_steps": p10, "speedup_p10": p10["other"] / p10["this"],
           "greedy_tokens_identical": tokens["this"] == tokens["other"]}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
