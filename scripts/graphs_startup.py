"""Decode graphs captured at start-up, on one device (scripts/gpu_check.py's graphs_startup step).

    python scripts/graphs_startup.py --device cuda --model M --json graphs_startup.json

Builds one engine with cuda_graphs on and writes what its start-up did, all measured: the order of the KV
sizing (profile, graphs, kv), the bytes the graphs were measured to take before the KV cache was sized
and those the real capture took (expected equal: what a graph holds does not depend on the cache's size;
their difference is written too), the buckets built, how long the engine took to build, then whether a
few greedy decode steps replay the graphs and give the tokens of the same engine with graphs off. On the
CPU nothing is captured: the static buffers are built and run, and every graph figure is 0 bytes (said
so in the JSON's "note").
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

PROMPTS = ["Hello there", "The quick brown fox jumps over", "a", "Paged attention stores keys and values"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="graphs_startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--json", required=True, help="where the result goes")
    p.add_argument("--max-num-seqs", type=int, default=16, help="start-up buckets: every one up to this")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--attention-backend", default="native",
                   help="'native': the Triton kernels on CUDA; 'flex' FlexAttention; 'fast' the eager gather")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--memory-budget-mib", type=int, default=None,
                   help="a whole-memory budget (weights, graphs, KV) instead of the device's profiled memory")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = EngineConfig(model=args.model, device=args.device, cuda_graphs=True, max_num_seqs=args.max_num_seqs,
                          max_model_len=args.max_model_len, attention_backend=args.attention_backend,
                          memory_budget_bytes=args.memory_budget_mib and args.memory_budget_mib * 2**20)
    lines: list[str] = []
    t0 = time.perf_counter()
    eng = LLMEngine(config, progress=lambda message, fraction: lines.append(message))
    build_s = time.perf_counter() - t0
    graphs, sizing = eng.runner.graphs, eng.weights.kv_sizing
    startup = dict(captures=graphs.num_captures, pool_bytes=graphs.pool_bytes, capture_error=graphs.capture_error)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    with_graphs = [list(o.token_ids) for o in eng.generate(PROMPTS, params)]
    runs, replays, captures = graphs.num_runs, graphs.num_replays, graphs.num_captures
    eng.reconfigure(cuda_graphs=False)
    without = [list(o.token_ids) for o in eng.generate(PROMPTS, params)]
    result = {
        "device": str(eng.device), "model": args.model, "attention_backend": eng.runner.backend.name,
        "engine_build_seconds": round(build_s, 3),
        "kv_sizing": {"order": sizing.steps, "peak_step_bytes": sizing.peak_step_bytes,
                      "graphs_bytes_measured_before_kv": sizing.graphs_bytes,
                      "kv_blocks": eng.block_manager.num_blocks},
        # both measured; by construction they agree (the graphs' buffers and block masks are sized by the
        # buckets, not the KV cache), up to the allocator's rounding: the difference says by how much
        "graphs_bytes_at_capture_minus_before_kv": startup["pool_bytes"] - sizing.graphs_bytes,
        "startup": {**startup, "buckets": graphs.startup_buckets,
                    "progress": [m for m in lines if "decode graphs" in m]},
        "decode": {"steps_in_graph_buffers": runs, "replays": replays, "captures_after_startup": captures
                   - startup["captures"], "tokens_match_graphs_off": with_graphs == without},
        "note": ("captured on CUDA" if eng.device.type == "cuda" else
                 "the CPU: static buffers built and run, nothing captured, so every graph figure is 0 bytes"),
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["kv_sizing"]), json.dumps(result["decode"]))
    # 16-bit tokens may differ by a rounding between the two paths on a GPU: recorded, not a failure
    return 0 if graphs.startup_buckets else 1


if __name__ == "__main__":
    sys.exit(main())
