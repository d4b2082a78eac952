"""`inferlab bench spec`: speculative decoding vs none, one stream and many, same outputs checked."""
from __future__ import annotations

import time

from app.device_args import device_options
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.quant.quality import heldout_texts

METHODS = {"ngram": dict(spec_method="ngram"), "draft-int4-self": dict(spec_method="draft", draft_quant_format="int4"),
           "mtp": dict(spec_method="mtp")}


QUESTIONS = ["Why do cats purr?", "How do I make a paper airplane?", "What should I pack for a weekend hike?",
             "How does a microwave oven heat food?", "Give me advice for a first job interview.",
             "Why is the ocean salty?", "How do noise-cancelling headphones work?", "What is a good morning routine?"]


def prompts(engine: LLMEngine, n: int, workload: str = "echo") -> list[list[int]]:
    """Chat prompts. "echo": restate a paragraph, the kind of answer that quotes its prompt (n-gram lookup's
    best case); "chat": fresh questions (none from the MTP training prompts), answered in free text."""
    paras = heldout_texts()
    out = []
    for i in range(n):
        if workload == "echo":
            text = paras[i % len(paras)][:600]
            content = f"Repeat this paragraph, then summarise it:\n\n{text}"
        else:
            content = QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (version {i})")
        msg = [{"role": "user", "content": content}]
        out.append(engine.tokenizer.encode(engine.tokenizer.apply_chat_template(msg)))
    return out


def timed_run(engine: LLMEngine, batch: list[list[int]], max_tokens: int) -> tuple[float, list, dict]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    s0 = engine.stats()
    t0 = time.perf_counter()
    outs = engine.generate(batch, params)
    dt = time.perf_counter() - t0
    s1 = engine.stats()
    produced = sum(len(o.token_ids) for o in outs)
    drafted = s1.num_draft_tokens - s0.num_draft_tokens
    accepted = s1.num_accepted_tokens - s0.num_accepted_tokens
    passes = s1.num_verify_passes - s0.num_verify_passes
    emitted = s1.num_spec_emitted_tokens - s0.num_spec_emitted_tokens
    info = {"seconds": dt, "output_tokens_per_s": produced / dt,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_verify_pass": emitted / passes if passes else None}
    return dt, [o.token_ids for o in outs], info


def agreement(got: list, want: list) -> dict:
    """Identical outputs, and how far they agree when not. In bf16 a different batch shape rounds
    differently, so a near-tie can flip a greedy token; the fp32 tests check exact equality."""
    prefix = []
    for a, b in zip(got, want):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / max(len(b), 1))
    return {"same_outputs": sum(a == b for a, b in zip(got, want)) / len(want),
            "mean_agreeing_prefix": sum(prefix) / len(prefix)}


def run_spec_bench(args) -> dict:
    base_cfg = dict(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads,
                    max_num_seqs=max(args.streams), kv_cache_memory_bytes=1024 * 2**20)
    plain = LLMEngine(EngineConfig(**base_cfg))
    workloads = ["echo", "chat"] if args.workload == "both" else [args.workload]
    # one row per (workload, streams), named like "chat/16"
    batches = {f"{w}/{n}": prompts(plain, n, w) for w in workloads for n in args.streams}
    baseline = {}
    timed_run(plain, batches[next(iter(batches))][:1], 4)  # warm-up
    for n, batch in batches.items():
        baseline[n] = timed_run(plain, batch, args.max_tokens)
    del plain
    results = {"baseline": {n: b[2] for n, b in baseline.items()}}
    for name, extra in METHODS.items():
        if args.methods and name not in args.methods:
            continue
        try:
            eng = LLMEngine(EngineConfig(**base_cfg, num_speculative_tokens=args.k, **extra))
        except ValueError as exc:  # e.g. MTP heads not trained for this model yet
            results[name] = {"skipped": str(exc)}
            continue
        rows = {}
        timed_run(eng, batches[next(iter(batches))][:1], 4)  # warm-up
        for n, batch in batches.items():
            dt, tokens, info = timed_run(eng, batch, args.max_tokens)
            info["speedup"] = baseline[n][0] / dt
            info.update(agreement(tokens, baseline[n][1]))
            rows[n] = info
        if name == "mtp":
            rows["heads"] = eng.proposer.meta
        results[name] = rows
        del eng
    return {"k": args.k, "max_tokens": args.max_tokens, "streams": args.streams, "workloads": workloads,
            "results": results}
