"""EngineInfo: what the GUI may know about the engine a source runs, and what the source can do.

Plain data only: no tensors, no tokenizer (the engine thread turns token ids into text before it
publishes). `Capabilities` is declared by the source, never found by probing the engine's attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from engine.knobs import KNOB, KnobValues, knob_subset


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an engine source can do or show; the GUI reads these and says on screen what is missing."""

    step_events: bool = False  # per-step EngineStepEvents (timeline, Gantt, latency, token colours)
    memory_breakdown: bool = False  # MemorySnapshots (weights / KV / activations / free)
    block_map: bool = False  # BlockMapSnapshots (the KV block map)
    load_generator: bool = False  # the built-in load generator runs next to the engine
    sweep: bool = False  # the tradeoff sweep runs in the engine's thread
    quantization: bool = False  # the weight format changes at run time
    perplexity: bool = False  # quality is measured on held-out text
    speculative: bool = False  # n-gram / draft-model speculative decoding
    mtp: bool = False  # multi-token prediction heads are trained for this model
    rebuild: bool = False  # construction-time fields (KV size, draft model) change by rebuilding
    serve: bool = False  # the app can serve the OpenAI API on this engine
    lora: bool = False  # multi-LoRA serving: an adapter pool, requests that name an adapter
    server_metrics: bool = False  # an attached server's scraped /metrics (the Server panel)
    client_timings: bool = False  # per-request timings measured by the client as streams arrive (attached)
    recorded: bool = False  # a recording (app/replay/): the run as it was, every control read-only
    reconfigurable: tuple[str, ...] = ()  # EngineConfig fields that change between steps
    restartable: tuple[str, ...] = ()  # knobs a managed server takes by restarting with new flags

    def names(self) -> frozenset[str]:
        """The boolean capabilities that are on, by field name."""
        return frozenset(f.name for f in fields(self) if f.type == "bool" and getattr(self, f.name) is True)

    def __contains__(self, name: object) -> bool:
        """By name only where the name is data (a panel's needs, a preset's features); code reads the
        attribute (`capabilities.lora`), so a misspelt capability fails at once."""
        return name in self.names()


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the GUI may know about the loaded engine (plain data; no tensors, no tokenizer)."""

    source: str  # the source's name, as the GUI says it ("the embedded engine", a server's URL)
    model: str
    model_path: str
    device: str
    dtype: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    has_chat_template: bool = False
    capabilities: Capabilities = field(default_factory=Capabilities)
    config: dict = field(default_factory=dict)  # the engine's settings by name (the knobs, the model, ...)
    weights_origin: str = ""  # where the weights came from, in words ("" for weights as a folder stores them)
    compute: str = ""  # dtype, compute path, kernel tier and threads, and why (LLMEngine.compute_line)
    compute_short: str = ""  # the same without the reasons (the status bar; the reasons in its tooltip)

    @property
    def knobs(self) -> KnobValues:
        """The knob table's values among `config`, typed: what the GUI reads of them."""
        return knob_subset(self.config, KNOB)

    @property
    def reconfigurable(self) -> tuple[str, ...]:
        return self.capabilities.reconfigurable


def mtp_heads_file(engine) -> str | None:
    """The multi-token prediction heads this engine's model can use, if they have been trained."""
    from engine.spec.mtp import find_heads

    path = find_heads(str(engine.model_path), engine.config.mtp_heads)
    return str(path) if path is not None else None


def embedded_capabilities(engine) -> Capabilities:
    """What the embedded LLMEngine offers (declared here, where the app hosts it): everything, and MTP
    when its heads have been trained for this model."""
    return Capabilities(step_events=True, memory_breakdown=True, block_map=True, load_generator=True, sweep=True,
                        quantization=True, perplexity=True, speculative=True, mtp=mtp_heads_file(engine) is not None,
                        rebuild=True, serve=True, lora=True, reconfigurable=tuple(engine.RECONFIGURABLE))


def make_info(e, source: str) -> EngineInfo:
    """What the GUI may know about a loaded engine (engine thread)."""
    cfg = e.config
    return EngineInfo(source=source, model=cfg.model, model_path=str(e.model_path), device=str(e.device),
                      dtype=str(e.dtype).removeprefix("torch."), max_model_len=e.max_model_len,
                      num_kv_blocks=e.memory().kv_blocks_total, block_size=cfg.block_size,
                      has_chat_template=bool(e.tokenizer.has_chat_template),
                      capabilities=embedded_capabilities(e),
                      config=cfg.knob_values(), weights_origin=e.weights_origin,
                      compute=e.compute_line(), compute_short=e.compute_line(short=True))
