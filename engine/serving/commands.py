"""Typed commands for the engine loop (engine/serving/loop.py): frozen dataclasses, dispatched by type.

Requests, aborts and scheduling knobs do NOT travel as commands: `LLMEngine.add_request`, `abort` and
`reconfigure` are thread-safe (they queue into the engine's own inbox) and must raise their refusals
(ValueError, RequestRejected) in the caller's thread, where an HTTP handler turns them into a 400/429.
Commands are for work that must run in the engine thread, between two steps.
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
