"""Sampled decode end to end on the real model: the sampler's native sample_rows (a row sampled at its
temperature drawn in the native call) against the same engine with sampled rows on torch's path (the native
module's greedy_rows only, as before sample_rows), alternating rounds in one process, the same prompts and seeds.

    python scripts/sampled_rows_ab.py [--threads 2] [--streams 1 8] [--rounds 5] [--tokens 64] [--json OUT]

Prints tokens/s (prefill included) per path and their ratio per streams count. Run it at low load (`uptime`)."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


class GreedyRowsOnly:
    """The native module as the sampler saw it before sample_rows: greedy rows only (sampled rows: torch)."""

    def __init__(self, module) -> None:
        self.module = module

    def tier(self) -> str:
        return self.module.tier()

    def greedy_rows(self, logits):
        return self.module.greedy_rows(logits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--json")
    args = ap.parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.quant.quality import heldout_texts

    engine = LLMEngine(EngineConfig(model=args.model, dtype="bfloat16", num_threads=args.threads))
    runner = engine.runner
    native = runner.rows_kernel
    if native is None or not hasattr(native, "sample_rows"):
        raise SystemExit("no native rows kernel runs here (no C++ toolchain, or the portable tier)")
    paths = {"sample_rows": native, "torch_sampled_rows": GreedyRowsOnly(native)}
    texts = heldout_texts()
    out: dict = {"engine": engine.compute_line(), "threads": args.threads, "tokens": args.tokens,
                 "temperature": args.temperature, "rounds": args.rounds, "streams": {}}
    for n in args.streams:
        prompts = [engine.tokenizer.encode(texts[i % len(texts)])[:32] for i in range(n)]
        runs: dict[str, list[float]] = {k: [] for k in paths}
        for rnd in range(args.rounds + 1):  # round 0 warms both up and is not counted
            for name, kernel in paths.items():
                params = [SamplingParams(max_tokens=args.tokens, temperature=args.temperature, seed=i + 100 * rnd,
                                         ignore_eos=True) for i in range(n)]
                runner.rows_kernel = kernel
                t0 = time.perf_counter()
                engine.generate(prompts, params)
                if rnd:
                    runs[name].append(n * args.tokens / (time.perf_counter() - t0))
        runner.rows_kernel = native
        med = {k: statistics.median(v) for k, v in runs.items()}
        out["streams"][str(n)] = {"tokens_per_s": med, "each_round": runs,
                                  "ratio": med["sample_rows"] / med["torch_sampled_rows"]}
        print(f"{n} streams: sample_rows {med['sample_rows']:.1f} tok/s, torch's sampled rows "
              f"{med['torch_sampled_rows']:.1f} ({out['streams'][str(n)]['ratio']:.2f}x)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
