"""Scheduling policies: which waiting request is admitted next. Pluggable by name.

A policy only orders the waiting queue; the scheduler still decides how many tokens each admitted
request gets. `pick` sees the whole queue (a deque, preempted requests at the front) and the time.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.core.request import Request, RequestStatus
from engine.events import SchedulingPolicy

# Shortest-prompt-first counts a second of waiting as this many prompt tokens. With it a prompt of
# L tokens that has waited w seconds beats a fresh prompt of S tokens once L - rate * w < S, so no
# prompt waits more than about (L - S) / rate seconds for shorter ones: aging ends starvation.
DEFAULT_AGING_TOKENS_PER_S = 256.0


class Policy(Protocol):
    name: str

    def pick(self, waiting: Sequence[Request], now: float) -> Request: ...


class FCFS:
    """First come, first served. Preempted requests sit at the front of the queue, so they go first."""

    name = SchedulingPolicy.FCFS

    def pick(self, waiting: Sequence[Request], now: float) -> Request:
        return waiting[0]


class ShortestPromptFirst:
    """The request with the fewest tokens left to prefill goes first, aged by its wait.

    key = tokens to prefill - aging_rate * seconds waited (smallest wins; ties go to the earliest).
    Short chats no longer queue behind a long document, and the document's key keeps falling while
    it waits, so a steady stream of short prompts cannot hold it back for ever. Preempted requests
    go first, as in FCFS: they already held a seat and their recompute is bounded.
    """

    name = SchedulingPolicy.SPF

    def __init__(self, aging_tokens_per_s: float = DEFAULT_AGING_TOKENS_PER_S) -> None:
        if not aging_tokens_per_s > 0:
            raise ValueError(f"aging rate must be > 0 (zero would allow starvation), got {aging_tokens_per_s!r}")
        self.aging_tokens_per_s = aging_tokens_per_s

    def key(self, req: Request, now: float) -> float:
        return (req.num_tokens - req.num_computed_tokens) - self.aging_tokens_per_s * (now - req.arrival_time)

    def pick(self, waiting: Sequence[Request], now: float) -> Request:
        if waiting[0].status is RequestStatus.PREEMPTED:
            return waiting[0]
        return min(waiting, key=lambda r: (self.key(r, now), r.arrival_time))


class PriorityFirst:
    """Lowest `Request.priority` value first; first come, first served within a priority.

    Preempted requests go before fresh ones of the same priority (never before a more urgent one).
    No aging: a steady stream of urgent requests can hold back the rest, which is what priority means.
    """

    name = SchedulingPolicy.PRIORITY

    def pick(self, waiting: Sequence[Request], now: float) -> Request:
        return min(waiting, key=lambda r: (r.priority, r.status is not RequestStatus.PREEMPTED, r.arrival_time))


POLICIES: dict[SchedulingPolicy, type] = {p.name: p for p in (FCFS, ShortestPromptFirst, PriorityFirst)}


def make_policy(name: SchedulingPolicy) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r}; choose from {', '.join(POLICIES)}") from None
