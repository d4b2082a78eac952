"""inferlab's inference engine: paged KV cache, continuous batching, torch only (never Qt).

The public names are imported lazily, so that `import engine.events` (the torch-free contract the GUI
reads) does not pull torch into a process that only displays events.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["EngineConfig", "EngineStats", "LLMEngine", "SamplingParams"]

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.queries import EngineStats
    from engine.sampling_params import SamplingParams

_WHERE = {"EngineConfig": "engine.config", "EngineStats": "engine.queries", "LLMEngine": "engine.llm_engine",
          "SamplingParams": "engine.sampling_params"}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
