"""EngineInfo: what the GUI may know about the loaded engine, and which features it offers."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the GUI may know about the loaded engine (plain data and the tokenizer; no tensors)."""

    model: str
    model_path: str
    device: str
    dtype: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    tokenizer: object
    capabilities: frozenset[str] = field(default_factory=frozenset)
    config: dict = field(default_factory=dict)
    reconfigurable: tuple[str, ...] = ()  # EngineConfig fields reconfigure() changes between steps


def engine_capabilities(engine) -> frozenset[str]:
    """Features the engine offers: what `engine.capabilities()` reports when it exists, else what its
    public verbs show: "quantization" (set_quantization), "perplexity", "speculative" (n-gram and
    draft proposers, switched by rebuilding the engine)."""
    caps = getattr(engine, "capabilities", None)
    if callable(caps):
        value = caps()
        return frozenset(k for k, v in value.items() if v) if isinstance(value, dict) else frozenset(value)
    found = set()
    if callable(getattr(engine, "set_quantization", None)):
        found.add("quantization")
    if callable(getattr(engine, "perplexity", None)):
        found.add("perplexity")
    if hasattr(engine.config, "spec_method") and importlib.util.find_spec("engine.spec.verify") is not None:
        found.add("speculative")
        if mtp_heads_file(engine) is not None:
            found.add("mtp")
    return frozenset(found)


def mtp_heads_file(engine) -> str | None:
    """The multi-token prediction heads this engine's model can use, if they have been trained."""
    from pathlib import Path

    from engine.spec.mtp import heads_path

    path = getattr(engine.config, "mtp_heads", None) or heads_path(str(engine.model_path))
    return str(path) if Path(path).exists() else None


def make_info(e) -> EngineInfo:
    """What the GUI may know about a loaded engine."""
    cfg = e.config
    return EngineInfo(model=cfg.model, model_path=str(e.model_path), device=str(e.device),
                      dtype=str(e.dtype).removeprefix("torch."), max_model_len=e.max_model_len,
                      num_kv_blocks=e.block_manager.num_blocks, block_size=cfg.block_size,
                      tokenizer=e.tokenizer, capabilities=engine_capabilities(e),
                      config={k: getattr(cfg, k) for k in cfg.__slots__},
                      reconfigurable=tuple(getattr(type(e), "RECONFIGURABLE", ())))
