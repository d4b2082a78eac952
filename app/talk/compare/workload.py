"""The seeded workload of a comparison: a list of planned requests made ONCE from the seed, then run
unchanged under every configuration (same prompts, same token budgets, same sampling seeds).

Prompts are windows of real text (app/load/generator.py). Arrival times: all at t=0 ("all"), Poisson
gaps drawn at rate 1 and divided by the rate ("poisson": another rate keeps the same requests and only
squeezes the times), or a Poisson stream with `burst_requests` long prompts arriving together at the
moment the stream is a third done ("burst")."""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from app.load.generator import LoadConfig, LoadGenerator
from app.load.kinds import ArrivalKind
from app.talk.compare.kinds import ArrivalMode, PlannedKind
from app.talk.compare.spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    at_unit: float  # arrival in units of 1 / rate seconds (0 for "all")
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    seed: int
    kind: PlannedKind = PlannedKind.NORMAL

    def at_s(self, rate: float) -> float:
        return self.at_unit / rate


def plan(spec: WorkloadSpec, corpus_ids: list[int], max_model_len: int) -> list[PlannedRequest]:
    rng = random.Random(spec.seed)
    load = LoadConfig(arrival_rate=0.0, prompt_tokens=spec.prompt_tokens, output_tokens=spec.output_tokens,
                      burst_prompt_tokens=spec.burst_prompt_tokens, burst_output_tokens=spec.output_tokens,
                      shared_prefix_tokens=spec.shared_prefix_tokens, temperature=0.0, ignore_eos=True)
    gen = LoadGenerator(load, corpus_ids=corpus_ids, rng_seed=spec.seed, max_model_len=max_model_len)
    out, t = [], 0.0
    for i in range(spec.requests):
        if spec.arrival != ArrivalMode.ALL and i > 0:
            t += rng.expovariate(1.0)
        a = gen.make_arrival(ArrivalKind.POISSON)
        out.append(PlannedRequest(i, t, tuple(a.prompt_token_ids), a.sampling["max_tokens"], a.sampling["seed"]))
    if spec.arrival == ArrivalMode.BURST:
        at = out[len(out) // 3].at_unit if out else 0.0
        for _ in range(spec.burst_requests):
            a = gen.make_arrival(ArrivalKind.BURST)
            out.append(PlannedRequest(len(out), at, tuple(a.prompt_token_ids), a.sampling["max_tokens"],
                                      a.sampling["seed"], PlannedKind.BURST))
        out.sort(key=lambda r: (r.at_unit, r.index))
        out = [replace(r, index=i) for i, r in enumerate(out)]
    return out
