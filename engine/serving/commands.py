"""Typed commands for the engine loop (engine/serving/loop.py): frozen dataclasses, dispatched by type.

They travel in the loop's one CommandQueue (engine/commands.py), beside the engine's own commands: requests,
aborts and scheduling knobs go in through `LLMEngine.add_request`, `abort` and `reconfigure`, which check them
first with the pure validators (engine/validation.py) and raise their refusals (ValueError, RequestRejected)
in the caller's thread, where an HTTP handler turns them into a 400/429. The commands here are for work
that must run in the engine thread, between two steps.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Rebuild:
    """Build a new engine with these EngineConfig fields changed (e.g. the KV budget); live requests are
    aborted first; every subscriber is re-attached to the new engine (to the old one if the build fails)."""

    changes: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AbortAll:
    """Abort every live request and step until they are gone (their streams end with "abort")."""


@dataclass(frozen=True, slots=True)
class RunInLoop:
    """Run `work(engine)` in the engine thread between two steps (benchmarks, one-off measurements)."""

    work: Callable[[object], None]
    label: str = "work"
