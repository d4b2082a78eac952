"""Arrival rates as multiples of a capacity measured on this machine (`rate_unit = "capacity"`).

Goodput falls only once arrivals exceed what the machine serves within the budget: at a fixed rate in
requests/s a fast CPU keeps up (goodput rises with the rate) and a slow one breaks the budget at every
rate. So the comparison first measures the capacity: the requests/s the engine serves with a workload of
other prompts of the same lengths arriving all at once (this run also warms the engine up). The rates
are then multiples of it, and the number of requests follows from it too: in a finite run at a rate far
above capacity, the requests that still meet the TTFT budget are about the ones started within it
(max_num_seqs + capacity x TTFT budget); with three times that many requests, most of a run far above
capacity waits past the budget, whatever the machine's speed.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from app.talk.compare.collect import RunRecord
from app.talk.compare.drive import Driver
from app.talk.compare.kinds import ArrivalMode, RunMode
from app.talk.compare.spec import WorkloadSpec
from app.talk.compare.workload import plan

REQUESTS_PER_BUDGET = 3  # requests per one "started within the TTFT budget" at a rate far above capacity


@dataclass(frozen=True, slots=True)
class Capacity:
    requests_per_s: float  # measured: all at once, max_num_seqs at a time
    served_within_budget: float  # max_num_seqs + capacity x TTFT budget
    requests: int  # the workload's request count from it (at least the preset's)

    def as_dict(self) -> dict:
        return {"capacity_rps": self.requests_per_s, "served_within_ttft_budget": self.served_within_budget,
                "requests": self.requests}


def measure_capacity(engine, workload: WorkloadSpec, corpus, ttft_s: float, cancelled) -> Capacity:
    """Serve other prompts of the workload's lengths, all arriving at once, and time them."""
    others = plan(replace(workload, seed=workload.seed + 2000, arrival=ArrivalMode.ALL), corpus, engine.max_model_len)
    t0 = time.perf_counter()
    Driver(engine, RunRecord(), cancelled, "capacity").run(RunMode.CONTINUOUS, others, 1.0)
    rps = len(others) / (time.perf_counter() - t0)
    engine.block_manager.reset_prefix_cache()  # the timed runs start with a cold prefix cache
    within = engine.config.max_num_seqs + rps * ttft_s
    return Capacity(rps, within, max(workload.requests, math.ceil(REQUESTS_PER_BUDGET * within)))


def capacity_label(multiple: float, capacity: Capacity) -> str:
    return f"{multiple:g}x capacity ({multiple * capacity.requests_per_s:.2g}/s)"
