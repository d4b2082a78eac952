"""`inferlab bench lora --json OUT`: what serving many LoRA adapters in one batch costs.

The same seeded workload (N streams, same prompts, greedy, fixed output length) runs
  - on the base model with no LoRA support at all (no wrappers in the model),
  - on an engine with a LoRA pool, every request on the base model (the wrappers' cost when unused),
  - with 1, 4 and 16 distinct adapters in the mix (round-robin over the requests), with a pool of
    `--max-loras` device slots (smaller than 16: the scheduler holds back requests whose adapter has no
    slot, and slots are evicted and reloaded, from host memory or from disk past `--max-cpu-loras`),
  - for each adapter rank (8, 16, 64; all seven projections),
  - and one adapter merged into the weights (no per-row update at all) against the same adapter unmerged.
Adapters are random (B nonzero), written as PEFT folders in a temporary directory. Rounds alternate the
configurations so a drifting machine speed hits all of them alike; medians are reported.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from app.device_args import device_options
from app.generate import stderr_progress
from app.load.workload import corpus_tokens
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.lora.adapter import TARGETS, load_adapter
from engine.lora.merge import merge_adapter
from engine.lora.peft_write import random_adapter, save_peft_adapter


def add_lora_bench_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="write the results here")
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    p.add_argument("--mixes", type=int, nargs="+", default=[1, 4, 16], help="distinct adapters in the mix")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-loras", type=int, default=8, help="device slots (below the largest mix: swapping)")
    p.add_argument("--max-cpu-loras", type=int, default=4, help="adapters kept in host memory beyond the slots")
    p.add_argument("--rounds", type=int, default=2)


def _engine(args, **kw) -> LLMEngine:
    cfg = EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads,
                       max_num_seqs=max(args.streams, 1), kv_cache_memory_bytes=512 * 2**20, **kw)
    return LLMEngine(cfg, progress=stderr_progress)


def _run(engine: LLMEngine, prompts: list[list[int]], names: list[str | None], max_tokens: int) -> dict:
    """One measured pass (cold prefix cache): output tokens/s, steps, adapter loads and evictions."""
    engine.block_manager.reset_prefix_cache()
    pool0 = engine.lora.snapshot() if engine.lora else None
    steps0 = engine.stats().num_steps
    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                           lora_names=names)
    dt = time.perf_counter() - t0
    row = {"seconds": dt, "output_tokens_per_s": sum(len(o.token_ids) for o in outs) / dt,
           "steps": engine.stats().num_steps - steps0, "tokens": [list(o.token_ids) for o in outs]}
    if pool0 is not None:
        pool1 = engine.lora.snapshot()
        row.update(adapter_loads=pool1.num_loads - pool0.num_loads,
                   adapter_evictions=pool1.num_evictions - pool0.num_evictions)
    return row


def _median(runs: list[dict]) -> dict:
    best = sorted(runs, key=lambda r: r["output_tokens_per_s"])[len(runs) // 2]
    out = {k: v for k, v in best.items() if k != "tokens"}
    out["output_tokens_per_s_each_round"] = [r["output_tokens_per_s"] for r in runs]
    return out


def _rounds(cases: dict, prompts: list[list[int]], max_tokens: int, rounds: int) -> dict[str, list[dict]]:
    """cases: name -> (engine, lora names). Each case once to warm up, then alternating rounds."""
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    for engine, names in cases.values():
        _run(engine, prompts[:2], names[:2], 4)
    for _ in range(rounds):
        for name, (engine, names) in cases.items():
            runs[name].append(_run(engine, prompts, names, max_tokens))
    return runs


def run_lora_bench(args) -> dict:
    plain = _engine(args)
    corpus = corpus_tokens(plain.tokenizer)
    n, k = args.streams, args.prompt_tokens
    prompts = [corpus[i * k : (i + 1) * k] for i in range(n)]
    mc = plain.model_config
    max_adapters = max(args.mixes)
    result = {"streams": n, "prompt_tokens": k, "max_tokens": args.max_tokens, "max_loras": args.max_loras,
              "max_cpu_loras": args.max_cpu_loras, "rounds": args.rounds, "targets": list(TARGETS), "ranks": {}}
    with tempfile.TemporaryDirectory(prefix="inferlab-lora-bench-") as tmp:
        for rank in args.ranks:
            paths = [save_peft_adapter(Path(tmp) / f"r{rank}-{i}", random_adapter(mc, rank, tuple(TARGETS), seed=i),
                                       rank, 2.0 * rank) for i in range(max_adapters)]
            # the same KV blocks as the plain engine (the pool's bytes would otherwise come off its budget)
            pooled = _engine(args, max_loras=args.max_loras, max_lora_rank=rank, max_cpu_loras=args.max_cpu_loras,
                             num_kv_blocks=plain.block_manager.num_blocks)
            for i, path in enumerate(paths):
                pooled.add_lora(f"a{i}", str(path))
            cases = {"base_no_lora_support": (plain, [None] * n), "base_with_pool": (pooled, [None] * n)}
            cases.update({f"{m}_adapters": (pooled, [f"a{i % m}" for i in range(n)]) for m in args.mixes})
            merged = None
            if rank == args.ranks[0]:  # one adapter merged into the weights vs the same one unmerged
                merged = _engine(args)
                merge_adapter(merged.model, mc, load_adapter(paths[0], "a0", 1, mc, rank, merged.dtype))
                cases["1_adapter_merged"] = (merged, [None] * n)
            runs = _rounds(cases, prompts, args.max_tokens, args.rounds)
            rows = {name: _median(r) for name, r in runs.items()}
            base = rows["base_no_lora_support"]["output_tokens_per_s"]
            for row in rows.values():
                row["throughput_vs_base"] = row["output_tokens_per_s"] / base
            if merged is not None:
                same = [a == b for a, b in zip(runs["1_adapter_merged"][-1]["tokens"], runs["1_adapters"][-1]["tokens"])
                        ] if "1_adapters" in runs else []
                # bf16: W + sBA rounded once vs Wx + sBAx rounded apart; near-ties may flip a greedy token
                rows["1_adapter_merged"]["same_outputs_as_unmerged"] = sum(same) / len(same) if same else None
            result["ranks"][str(rank)] = {"pool_device_bytes": pooled.lora.device_bytes,
                                          "adapter_bytes": pooled.list_loras()[0].nbytes, "cases": rows}
            del pooled, merged
    result["summary_output_tokens_per_s"] = {
        r: {c: round(v["output_tokens_per_s"], 1) for c, v in d["cases"].items()} for r, d in result["ranks"].items()}
    return result
