"""The engine's cumulative counters, one object shared by the parts that count (the engine's update,
the speculative decoder's verify), so none reaches into another's fields to add a token."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineCounters:
    requests: int = 0  # drained into the scheduler
    finished: int = 0  # finished for any reason (stop, length, abort, error)
    failed: int = 0  # of those, failed on their own (forward raised, non-finite logits, bad command)
    prompt: int = 0  # prompt tokens of requests whose prefill completed
    generated: int = 0  # tokens emitted (sampled, or accepted / corrected / bonus in a verify)
    cached: int = 0  # prompt tokens served from the prefix cache (first admission only)
    steps: int = 0  # step() calls that did or announced work
