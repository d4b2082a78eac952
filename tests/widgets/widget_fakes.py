"""Synthetic engine events for widget tests and the render demo (deterministic, no engine)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from engine.events import (
    BlockInfo,
    BlockMapSnapshot,
    MemorySnapshot,
    RequestOutput,
    RequestTimeline,
    SpecDecodeStats,
    StepStats,
    TokenLogprob,
    TokenSource,
    TradeoffPoint,
)

MiB = 2**20
GiB = 2**30


def memory_snapshot(used: int = 300, cached: int = 100, total: int = 2000, source: str = "nvml",
                    device: str = "cuda:0") -> MemorySnapshot:
    block_bytes = 36 * 1024 * 16
    accounted = 270 * MiB + total * block_bytes + 600 * MiB + 900 * MiB
    return MemorySnapshot(weights_bytes=270 * MiB, kv_block_bytes=block_bytes, kv_blocks_total=total,
                          kv_blocks_used=used, kv_blocks_cached=cached, activation_bytes=600 * MiB,
                          other_bytes=900 * MiB, free_bytes=4 * GiB - accounted, device_total_bytes=4 * GiB,
                          source=source, device=device)


def block_map(num_blocks: int = 2000, num_requests: int = 12, blocks_per_request: int = 20,
              shared_prefix: int = 4, num_cached: int = 60) -> BlockMapSnapshot:
    """Requests own consecutive blocks after a prefix of `shared_prefix` blocks they all share;
    `num_cached` free-but-cached blocks follow."""
    owners: dict[int, list[str]] = {b: [] for b in range(shared_prefix)}
    tables: dict[str, tuple[int, ...]] = {}
    next_block = shared_prefix
    for r in range(num_requests):
        rid = f"req-{r}"
        own = list(range(next_block, next_block + blocks_per_request))
        next_block += blocks_per_request
        tables[rid] = tuple(range(shared_prefix)) + tuple(own)
        for b in tables[rid]:
            owners.setdefault(b, []).append(rid)
    infos = [BlockInfo(b, len(o), cached=b < shared_prefix, owners=tuple(o)) for b, o in owners.items()]
    infos += [BlockInfo(b, 0, cached=True) for b in range(next_block, next_block + num_cached)]
    return BlockMapSnapshot(block_size=16, num_blocks=num_blocks, block_tables=tables, blocks=tuple(infos))


def token_output(request_id: str, token_ids, texts, sources=None, logprobs=True, finished=False,
                 so_far: tuple[int, ...] = (), text_so_far: str = "") -> RequestOutput:
    n = len(token_ids)
    lps = tuple(TokenLogprob(t, -0.1 * (i + 1), ((t, -0.1 * (i + 1), texts[i] if i < len(texts) else ""),
                                                 (t + 1, -2.5, " alt"), (t + 2, -3.25, " other")))
                for i, t in enumerate(token_ids)) if logprobs else None
    new_text = "".join(texts)
    return RequestOutput(request_id=request_id, new_token_ids=tuple(token_ids), new_text=new_text,
                         token_ids=tuple(so_far) + tuple(token_ids), text=text_so_far + new_text,
                         finished=finished, finish_reason="stop" if finished else None,
                         sources=tuple(sources or (TokenSource.DECODED,) * n), logprobs=lps, num_prompt_tokens=5)


def spec_stats(step: int, k: int = 4, accept_prob: float = 0.7, passes: int = 4, method: str | None = "ngram",
               seed: int = 0) -> SpecDecodeStats:
    rng = random.Random(seed * 1000 + step)
    accepted, drafted = [0] * k, [0] * k
    emitted = 0
    for _ in range(passes):
        n_acc = 0
        for i in range(k):
            drafted[i] += 1
            if rng.random() < accept_prob * (0.92 ** i):
                accepted[i] += 1
                n_acc += 1
            else:
                break
        emitted += n_acc + 1
    return SpecDecodeStats(step=step, method=method, num_draft_tokens=sum(drafted),
                           num_accepted_tokens=sum(accepted), num_emitted_tokens=emitted,
                           num_verify_passes=passes, accepted_per_position=tuple(accepted),
                           drafted_per_position=tuple(drafted), predicted_speedup=2.1)


@dataclass
class TrafficSim:
    """A toy continuous-batching trace: arrivals, chunked prefill, decode, a few preemptions."""

    seed: int = 0
    chunk: int = 256
    max_running: int = 8
    t: float = 100.0
    step: int = 0
    arrivals: list[tuple[str, float]] = field(default_factory=list)
    finished: list[tuple[str, float, str]] = field(default_factory=list)
    timelines: list[RequestTimeline] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.waiting: list[dict] = []
        self.running: list[dict] = []
        self.n = 0

    def next_step(self) -> StepStats:
        if self.rng.random() < 0.12:
            rid = f"req-{self.n}"
            self.n += 1
            self.waiting.append({"id": rid, "arrival": self.t, "prompt": self.rng.choice([40, 120, 600]),
                                 "done": 0, "out": 0, "max_out": self.rng.randint(10, 40), "first": None,
                                 "sched": None})
            self.arrivals.append((rid, self.t))
        while self.waiting and len(self.running) < self.max_running:
            self.running.append(self.waiting.pop(0))
        budget, scheduled, prefill, decode = self.chunk, [], 0, 0
        wall = 0.02 + 0.002 * len(self.running)
        for r in self.running:
            if r["done"] < r["prompt"] and budget > 0:
                n = min(budget, r["prompt"] - r["done"])
                budget -= n
                r["done"] += n
                prefill += n
                scheduled.append((r["id"], n, "prefill"))
            elif r["done"] >= r["prompt"]:
                decode += 1
                r["out"] += 1
                scheduled.append((r["id"], 1, "decode"))
            if r["sched"] is None and scheduled and scheduled[-1][0] == r["id"]:
                r["sched"] = self.t
            if r["first"] is None and r["done"] >= r["prompt"]:
                r["first"] = self.t + wall
        preempted = 1 if self.step % 97 == 50 and len(self.running) > 2 else 0
        if preempted:
            victim = self.running.pop()
            victim["done"] = 0
            self.waiting.insert(0, victim)
        for r in [r for r in self.running if r["out"] >= r["max_out"]]:
            self.running.remove(r)
            end = self.t + wall
            self.finished.append((r["id"], end, "stop"))
            self.timelines.append(RequestTimeline(r["id"], r["arrival"], r["prompt"], r["sched"], r["first"], end,
                                                  r["out"], finish_reason="stop"))
        stats = StepStats(step=self.step, t_start=self.t, wall_time_s=wall, num_prefill_tokens=prefill,
                          num_decode_tokens=decode, num_running=len(self.running), num_waiting=len(self.waiting),
                          num_preempted=preempted, kv_blocks_used=10 * len(self.running), kv_blocks_total=2000,
                          num_rejected=1 if self.step % 131 == 70 else 0, scheduled=tuple(scheduled))
        self.t += wall + 0.001
        self.step += 1
        return stats


def tradeoff_points() -> list[TradeoffPoint]:
    return [
        TradeoffPoint("bits=16 batch=8", {"quant_format": "bf16", "max_num_seqs": 8}, 42.0, 320.0, 0.0),
        TradeoffPoint("bits=16 batch=32", {"quant_format": "bf16", "max_num_seqs": 32}, 25.0, 800.0, 0.0),
        TradeoffPoint("bits=8 batch=32", {"quant_format": "int8", "max_num_seqs": 32}, 31.0, 990.0, 0.4),
        TradeoffPoint("bits=4 batch=32", {"quant_format": "int4", "max_num_seqs": 32}, 38.0, 1200.0, 6.5),
        TradeoffPoint("bits=4 batch=64", {"quant_format": "int4", "max_num_seqs": 64}, 21.0, 1350.0, None),
    ]
