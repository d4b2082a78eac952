"""`inferlab bench serve`: goodput and p99 TTFT/TPOT vs Poisson arrival rate; FCFS vs shortest-prompt-
first; chunked vs unchunked prefill. One engine, reconfigured between runs (no reload).

Driver: the engine is stepped directly in this process (no HTTP, no AsyncEngine thread). Requests are
submitted at the first step boundary after their Poisson due time, and their latencies are measured
from the *due* time, so the time a request would have spent waiting behind a long step counts (that
wait is the traffic jam). Prefix caching is off, so every run prefills its prompts in full and runs
that reuse a prompt schedule stay comparable.

Workload: short chats (a chat-templated question of 16-64 corpus tokens) mixed with long prompts
(document-sized windows of the held-out text), the same seeded schedule for every configuration at a
given rate. Outputs run to max_tokens (ignore_eos) so every configuration does the same work.
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from dataclasses import dataclass

from app.device_args import device_options
from app.load.kinds import PromptKind
from app.load.workload import corpus_tokens
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.metrics import SLO, latency_report, percentile, request_timings
from engine.drive import drive


@dataclass(frozen=True, slots=True)
class TimedRequest:
    due_s: float  # seconds after the start of the run
    prompt_token_ids: list[int]
    max_tokens: int
    kind: PromptKind


def add_serve_bench_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="write the results here")
    p.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="arrivals per second")
    p.add_argument("--num-requests", type=int, default=16, help="requests per run")
    p.add_argument("--long-share", type=float, default=0.25, help="share of long prompts")
    p.add_argument("--long-tokens", type=int, nargs=2, default=[384, 640])
    p.add_argument("--chat-max-tokens", type=int, nargs=2, default=[8, 24])
    p.add_argument("--long-max-tokens", type=int, nargs=2, default=[4, 8])
    p.add_argument("--policies", nargs="+", default=["fcfs", "spf"])
    p.add_argument("--chunked", choices=["both", "on", "off"], default="both")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=128, help="token budget (the chunk size)")
    p.add_argument("--slo-ttft", type=float, default=1.5, help="TTFT target, seconds")
    p.add_argument("--slo-tpot", type=float, default=0.15, help="TPOT target, seconds")
    p.add_argument("--slo-percentile", type=float, default=99.0)
    p.add_argument("--seed", type=int, default=0)
    from app.bench.serve_peer import add_peer_args
    from app.bench.serve_url import add_url_args

    add_url_args(p)
    add_peer_args(p)


def make_schedule(tokenizer, args, rate: float, seed: int) -> list[TimedRequest]:
    rng = random.Random(seed)
    corpus = corpus_tokens(tokenizer)
    out, t = [], 0.0
    for _ in range(args.num_requests):
        t += rng.expovariate(rate)
        if rng.random() < args.long_share:
            n = rng.randint(*args.long_tokens)
            start = rng.randrange(0, max(1, len(corpus) - n))
            out.append(TimedRequest(t, corpus[start:start + n], rng.randint(*args.long_max_tokens), PromptKind.LONG))
            continue
        n = rng.randint(16, 64)
        start = rng.randrange(0, max(1, len(corpus) - n))
        question = tokenizer.decode(corpus[start:start + n])
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}]) \
            if tokenizer.has_chat_template else question
        ids = tokenizer.encode(text, add_special_tokens=False)
        out.append(TimedRequest(t, ids, rng.randint(*args.chat_max_tokens), PromptKind.CHAT))
    return out


def run_once(engine: LLMEngine, schedule: list[TimedRequest], slo: SLO) -> dict:
    """Submit on schedule, step until all finish; latencies from each request's due time."""
    finished, step_s = {}, []

    def listener(ev) -> None:
        finished.update((t.request_id, t) for t in ev.finished)
        step_s.append(ev.stats.wall_time_s)

    engine.add_listener(listener)
    steps0, pre0 = engine.stats().num_steps, engine.stats().num_preemptions
    due: dict[str, float] = {}
    pending = list(enumerate(schedule))
    t0 = time.perf_counter()

    def submit_due() -> None:
        now = time.perf_counter()
        while pending and t0 + pending[0][1].due_s <= now:
            i, r = pending.pop(0)
            rid = engine.add_request(r.prompt_token_ids, SamplingParams(
                max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True), request_id=f"serve-{i}")
            due[rid] = t0 + r.due_s

    try:
        drive(engine, until=lambda: not pending and not engine.has_unfinished(), before_step=submit_due,
              idle_wait=lambda: t0 + pending[0][1].due_s - time.perf_counter() if pending else 0.0)
    finally:
        engine.remove_listener(listener)
    timings = [request_timings(dataclasses.replace(tl, arrival=due[rid])) for rid, tl in finished.items()]
    kinds = {f"serve-{i}": r.kind for i, r in enumerate(schedule)}
    end = max(tl.finished for tl in finished.values())
    report = latency_report(timings, end - t0, slo)
    by_kind = {k: latency_report([t for t in timings if kinds[t.request_id] == k], end - t0, slo).ttft
               for k in PromptKind}
    return {"report": report.as_dict(), "ttft_by_kind": by_kind, "steps": engine.stats().num_steps - steps0,
            "preemptions": engine.stats().num_preemptions - pre0, "busy_s": sum(step_s),
            "median_step_s": percentile(step_s, 50), "max_step_s": max(step_s, default=None),
            "load_average_1m": os.getloadavg()[0]}


def run_serve_bench(args) -> dict:
    from app.generate import stderr_progress

    cfg = EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       enable_prefix_caching=False)
    engine = LLMEngine(cfg, progress=stderr_progress)
    slo = SLO(args.slo_ttft, args.slo_tpot, args.slo_percentile)
    engine.generate([corpus_tokens(engine.tokenizer)[:200]], SamplingParams(max_tokens=4, temperature=0.0))
    chunked = {"both": [True, False], "on": [True], "off": [False]}[args.chunked]
    schedules = {rate: make_schedule(engine.tokenizer, args, rate, args.seed) for rate in args.rates}
    runs = []
    for rate in args.rates:
        for chunk in chunked:
            for policy in args.policies:
                engine.reconfigure(policy=policy, enable_chunked_prefill=chunk)
                res = run_once(engine, schedules[rate], slo)
                runs.append({"rate_rps": rate, "policy": policy, "chunked_prefill": chunk, **res})
                _print_row(runs[-1])
    some = next(iter(schedules.values()))
    return {
        "driver": "in-process: LLMEngine.step() loop, requests submitted at their Poisson due time, "
                  "latency measured from the due time (no HTTP)",
        "workload": {"requests_per_run": args.num_requests, "long_share": args.long_share,
                     "long_prompt_tokens": args.long_tokens,
                     "chat_prompt_tokens": [min(_lens(some, PromptKind.CHAT), default=0),
                                            max(_lens(some, PromptKind.CHAT), default=0)],
                     "chat_max_tokens": args.chat_max_tokens, "long_max_tokens": args.long_max_tokens,
                     "rates_rps": args.rates, "seed": args.seed},
        "engine": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                   "prefix_caching": False, "dtype": str(engine.dtype).removeprefix("torch.")},
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "percentile": slo.percentile},
        "runs": runs,
        "table": [_row(r) for r in runs],
    }


def _lens(schedule: list[TimedRequest], kind: PromptKind) -> list[int]:
    return [len(r.prompt_token_ids) for r in schedule if r.kind == kind]


def _row(run: dict) -> dict:
    rep = run["report"]
    return {"rate_rps": run["rate_rps"], "policy": run["policy"], "chunked": run["chunked_prefill"],
            "goodput_rps": round(rep["goodput_rps"], 3), "slo_attainment": round(rep["slo_attainment"], 3),
            "p99_ttft_s": _r(rep["ttft"]["p99"]), "p99_tpot_s": _r(rep["tpot"]["p99"]),
            "p50_ttft_s": _r(rep["ttft"]["p50"]), "p50_ttft_chat_s": _r(run["ttft_by_kind"]["chat"]["p50"]),
            "p50_ttft_long_s": _r(run["ttft_by_kind"]["long"]["p50"]), "duration_s": round(rep["duration_s"], 1),
            "max_step_s": _r(run["max_step_s"]), "load_1m": round(run["load_average_1m"], 2)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _print_row(run: dict) -> None:
    r = _row(run)
    print(f"rate {r['rate_rps']:>4} rps  {r['policy']:<8} chunked={str(r['chunked']):<5}  goodput "
          f"{r['goodput_rps']:.2f} rps ({r['slo_attainment']:.0%})  p99 TTFT {r['p99_ttft_s']} s  "
          f"p99 TPOT {r['p99_tpot_s']} s  [{r['duration_s']} s, max step {r['max_step_s']} s, load {r['load_1m']}]",
          file=sys.stderr, flush=True)
