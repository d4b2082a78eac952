"""The kinds of generated traffic, as str-valued enums: a member equals its string, and JSON, TOML and
f-strings write it as that string, so stored results and files read as before."""
from __future__ import annotations

from engine.events import StrEnum  # enum.StrEnum, spelled out on Python 3.10


class ArrivalKind(StrEnum):
    """What made a load-generator arrival (Arrival.kind, the token-stream tab's label)."""

    POISSON = "poisson"  # the steady stream: prompt_tokens / output_tokens
    BURST = "burst"  # a burst of long prompts: burst_prompt_tokens / burst_output_tokens
    USER = "user"  # a closed-loop user asking again after its think time


class PromptKind(StrEnum):
    """Short chat prompts and long ones (documents) in a benchmark's mixed workload."""

    CHAT = "chat"
    LONG = "long"
