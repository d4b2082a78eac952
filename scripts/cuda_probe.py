"""Where a CUDA run spends (or loses) its time: one scenario per process, each engine phase timed, every
thread's stack written to the log every --dump-s seconds while it runs (faulthandler), so a run that
hangs on a GPU machine still says where (scripts/gpu_check.py's flex step runs one).

    python scripts/cuda_probe.py SCENARIO --model DIR [--device cuda] [--dump-s 20]

SCENARIO: backend:dtype:mode[:graphs], e.g. native:bfloat16:sample or fast:float32:greedy (mode sample = the
cuda test's seeded top-p/top-k with logprobs; greedy = temperature 0)."""
from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dump-s", type=float, default=0.0,
                   help="write every thread's stack every this many seconds (0: only on SIGABRT, with -X faulthandler; "
                        "on the H200 a periodic dump during inductor's compile crashed the process)")
    p.add_argument("--tokens", type=int, default=16)
    args = p.parse_args()
    faulthandler.enable()
    if args.dump_s > 0:
        faulthandler.dump_traceback_later(args.dump_s, repeat=True, file=sys.stderr)
    backend, dtype, mode, *extra = args.scenario.split(":")
    t0 = time.perf_counter()

    def say(what: str) -> None:
        print(f"[{time.perf_counter() - t0:7.2f} s] {args.scenario}: {what}", flush=True)

    from engine import EngineConfig, LLMEngine, SamplingParams

    say("imported")
    eng = LLMEngine(EngineConfig(model=args.model, device=args.device, dtype=dtype, attention_backend=backend,
                                 kv_cache_memory_bytes=256 * 2**20,
                                 cuda_graphs="graphs" in extra))
    b = eng.runner.backend
    flex = "off" if b.flex is None else "compiled" if b.flex.compiled else "eager"
    say(f"engine built (attention {b.name}, flex {flex}, graphs {eng.config.cuda_graphs})")
    params = (SamplingParams(max_tokens=args.tokens, temperature=0.8, top_p=0.9, top_k=20, seed=3, logprobs=2,
                             ignore_eos=True) if mode == "sample"
              else SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True))
    for i in range(3):
        t = time.perf_counter()
        out = eng.generate(["Hello there, how are you"], params)[0]
        dt = time.perf_counter() - t
        say(f"generate {i}: {len(out.token_ids)} tokens in {dt:.2f} s ({len(out.token_ids) / dt:.1f} tok/s)")
    faulthandler.cancel_dump_traceback_later()
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
