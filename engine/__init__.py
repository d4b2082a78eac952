"""inferlab's inference engine: paged KV cache, continuous batching, torch only (never Qt)."""
from engine.config import EngineConfig
from engine.llm_engine import EngineStats, LLMEngine
from engine.sampling_params import SamplingParams

__all__ = ["EngineConfig", "EngineStats", "LLMEngine", "SamplingParams"]
