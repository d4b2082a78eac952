"""Scheduling policies: which waiting request is admitted next. Pluggable by name."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.request import Request


class Policy(Protocol):
    name: str

    def pick(self, waiting: Sequence[Request], now: float) -> Request: ...


class FCFS:
    """First come, first served. Preempted requests sit at the front of the queue, so they go first."""

    name = "fcfs"

    def pick(self, waiting: Sequence[Request], now: float) -> Request:
        return waiting[0]


POLICIES: dict[str, type] = {"fcfs": FCFS}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r}; choose from {', '.join(POLICIES)}") from None
