"""The kinds a comparison's [compare] table names, as str-valued enums: a member equals its string, and
JSON (the stored results, their fingerprints) and TOML write it as that string, so presets and stored
results read as before."""
from __future__ import annotations

from engine.events import StrEnum  # enum.StrEnum, spelled out on Python 3.10


class RunMode(StrEnum):
    """How a configuration runs (ConfigSpec.mode)."""

    CONTINUOUS = "continuous"  # the engine's own scheduling
    STATIC = "static"  # the next batch of max_num_seqs only when the whole previous one has finished
    RECOMPUTE = "recompute"  # no KV cache: every token recomputes the ones before it
    CONTIGUOUS = "contiguous"  # computed, not run: the KV a max-length reservation per request would hold


class ArrivalMode(StrEnum):
    """When the workload's requests arrive (WorkloadSpec.arrival)."""

    ALL = "all"  # all at t = 0
    POISSON = "poisson"  # Poisson gaps at the rate
    BURST = "burst"  # a Poisson stream, and long prompts arriving together a third of the way in


class Warmup(StrEnum):
    """What each engine runs before it is measured (WorkloadSpec.warmup)."""

    SHORT = "short"  # one small request
    WORKLOAD = "workload"  # the whole workload once


class RateUnit(StrEnum):
    """What a rate means (WorkloadSpec.rate_unit)."""

    PER_S = "per_s"  # requests per second
    CAPACITY = "capacity"  # multiples of the capacity measured first (app/talk/compare/capacity.py)


class PlannedKind(StrEnum):
    """A planned request of the workload (PlannedRequest.kind)."""

    NORMAL = "normal"  # the workload's own requests
    BURST = "burst"  # one of the burst's long prompts
