"""inferlab's side of the benchmarks: the same workloads through LLMEngine."""
from __future__ import annotations

import time

from app.load.workload import BenchRequest
from engine import LLMEngine, SamplingParams
from engine.drive import drive


def count_output_tokens(engine: LLMEngine) -> int:
    """Step until nothing is left; the output tokens produced meanwhile."""
    produced = 0

    def count(outputs) -> None:
        nonlocal produced
        produced += sum(len(o.new_token_ids) for o in outputs)

    drive(engine, on_outputs=count)
    return produced


def engine_throughput(engine: LLMEngine, requests: list[BenchRequest]) -> dict:
    """All requests arrive at once; continuous batching does the rest. Starts with a cold prefix cache
    (what earlier runs left is forgotten), so repeated rounds measure the same work."""
    engine.block_manager.reset_prefix_cache()
    t0 = time.perf_counter()
    for r in requests:
        engine.add_request(r.prompt_token_ids, SamplingParams(max_tokens=r.max_tokens, temperature=0.0,
                                                              ignore_eos=True))
    steps0 = engine.stats().num_steps
    produced = count_output_tokens(engine)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "output_tokens": produced, "output_tokens_per_s": produced / dt,
            "steps": engine.stats().num_steps - steps0, "preemptions": engine.stats().num_preemptions}


def engine_one_stream(engine: LLMEngine, prompt_ids: list[int], max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    engine.add_request(prompt_ids, params)
    first = None
    tokens: list[int] = []

    def watch(outputs) -> None:
        nonlocal first, tokens
        for out in outputs:
            if out.new_token_ids and first is None:
                first = time.perf_counter()
            if out.finished:
                tokens = list(out.token_ids)

    drive(engine, on_outputs=watch)
    dt = time.perf_counter() - t0
    ttft = first - t0
    return {"seconds": dt, "ttft_s": ttft, "tokens": tokens,
            "decode_tokens_per_s": (max_tokens - 1) / max(dt - ttft, 1e-9), "tokens_per_s": max_tokens / dt}
