"""Per-request sampling knobs, validated at construction (and again by add_request).

The ranges are the ones the sampler is numerically safe for (engine/models/layers/sampler.py works in
float32): a positive temperature or top_p must stay a normal float32 number (smaller ones underflow to
0 or lose all precision), top_k must fit a tensor index, a seed must fit torch.Generator's 64 bits.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any

FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
FLOAT32_MAX = 3.4028234663852886e38
MAX_TOP_K = 2**31 - 1  # larger than any vocabulary; top_k >= vocab size means off
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
MAX_LOGPROBS = 20


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # added to the model's own
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return; None = no logprobs

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first field out of its range."""
        t = self.temperature
        if not _is_number(t) or not math.isfinite(t) or t < 0 or t > FLOAT32_MAX:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if 0 < t < FLOAT32_TINY:
            raise ValueError(f"temperature {t!r} underflows in float32 (use 0 for greedy decoding)")
        p = self.top_p
        if not _is_number(p) or math.isnan(p) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if p < FLOAT32_TINY:
            raise ValueError(f"top_p {p!r} underflows in float32 (the smallest is {FLOAT32_TINY:.3g})")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an integer in [0, {MAX_TOP_K}] (0 turns it off), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer between 0 and {MAX_LOGPROBS}, got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be integers >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# The fields a request carries by their own name and value: the HTTP API accepts them (app/server/protocol.py)
# and the remote source sends them on (app/remote/), both reading this table, so a new scalar field above
# travels with them. The rest have their own spelling on the wire (max_tokens defaults differ per endpoint;
# stop may be one string; logprobs is a bool plus top_logprobs in chat).
_OWN_WIRE_SPELLING = ("max_tokens", "stop", "stop_token_ids", "logprobs")
REQUEST_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {f.name: f.default for f in fields(SamplingParams) if f.name not in _OWN_WIRE_SPELLING})
REQUEST_FIELDS: tuple[str, ...] = tuple(REQUEST_DEFAULTS)
if MISSING in REQUEST_DEFAULTS.values():
    raise TypeError("a SamplingParams field with a default_factory needs its own wire spelling")
