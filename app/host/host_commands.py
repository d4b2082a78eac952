"""The app host's own commands for the engine loop: frozen dataclasses, dispatched by type
(EngineHost registers one handler per type on its EngineLoop). A rebuild is the loop's own
`engine.serving.commands.Rebuild`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.load.generator import LoadConfig


@dataclass(frozen=True, slots=True)
class StartLoad:
    pass


@dataclass(frozen=True, slots=True)
class StopLoad:
    pass


@dataclass(frozen=True, slots=True)
class Burst:
    """n long prompts at once."""

    n: int


@dataclass(frozen=True, slots=True)
class SubmitArrivals:
    """Fixed Arrivals (app/load/generator.py), submitted as load-generator requests (benchmarks)."""

    arrivals: tuple


@dataclass(frozen=True, slots=True)
class SetLoadConfig:
    config: LoadConfig


@dataclass(frozen=True, slots=True)
class UseLoras:
    """Register the adapters a preset mixes (found by name, engine/lora/shipped.py) and run the load
    generator's requests with them: `mix` holds adapter names and "base"."""

    mix: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AskEveryAdapter:
    """One prompt to the base model and to every registered adapter, in one batch."""

    prompt: str
    chat: bool = True
    max_tokens: int = 64


@dataclass(frozen=True, slots=True)
class SetArrivalRate:
    rate: float


@dataclass(frozen=True, slots=True)
class Quantize:
    """Requantize the weights to `quant_format` from the originals, measuring perplexity around it."""

    quant_format: str
    group_size: int | None = None  # weights per scale of a grouped format (None: the engine's setting)


@dataclass(frozen=True, slots=True)
class AdoptPerplexity:
    """Perplexities a sweep measured (weight format -> perplexity), known from now on (no new measurement)."""

    by_format: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Reset:
    """Stop the load, abort every request; a channel Reset follows their last events."""


@dataclass(frozen=True, slots=True)
class RunMeasurement:
    """Run `job(host)` in the engine thread: a tradeoff sweep (app/tradeoff/sweep.py) or a chapter's comparison
    (app/talk/compare_run.py), on engines of their own while the live load waits."""

    job: Callable[[object], None]
