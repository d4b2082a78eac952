"""The engine source -> GUI channel: one frozen dataclass per kind of item, dispatched by type.

The engine thread appends items to the host's deque; the GUI thread drains it (app/gui/panel_feeder.py has
the type -> handler table). Besides these, three engine contracts travel on the channel as they are:
`EngineStepEvent` (one per step), `MemorySnapshot` and `BlockMapSnapshot` (every ~100 ms).
Every fact is computed in the engine thread; the GUI only shows it.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.load.kinds import ArrivalKind


def drain(items: deque, limit: int | None = None) -> list:
    """Pop up to `limit` items (all when None) off the left of a source's deque, oldest first. The
    producer thread only appends, so the GUI thread may pop without a lock."""
    out = []
    pop = items.popleft
    try:
        while limit is None or len(out) < limit:
            out.append(pop())
    except IndexError:
        pass
    return out


@dataclass(frozen=True, slots=True)
class LoadStream:
    """The load generator submitted a request: a token-stream tab may open for it."""

    request_id: str
    kind: ArrivalKind  # what made the arrival (the steady stream, a burst, a closed-loop user)
    prompt_tail: str | None  # the end of its prompt as text, "[N prompt tokens]" appended
    lora_name: str | None = None  # the LoRA adapter it runs with (None: the base model)


@dataclass(frozen=True, slots=True)
class Reset:
    """The engine finished a reset or a rebuild: every request before it is gone; panels clear."""


@dataclass(frozen=True, slots=True)
class Message:
    """An error or a note for the status bar."""

    text: str


@dataclass(frozen=True, slots=True)
class ComputeChanged:
    """The engine's compute line changed while it runs (the native kernels built in the background took
    over): EngineInfo.compute and compute_short, new."""
    compute: str
    compute_short: str


@dataclass(frozen=True, slots=True)
class Busy:
    """Background work in the engine thread (requantizing, measuring): text "" when done."""

    text: str
    fraction: float | None


@dataclass(frozen=True, slots=True)
class SweepProgress:
    text: str
    fraction: float


@dataclass(frozen=True, slots=True)
class SweepPoint:
    point: dict  # one measured configuration of the sweep (app/tradeoff/sweep.py point_figures)


@dataclass(frozen=True, slots=True)
class SweepDone:
    result: dict | None  # the whole sweep (points, frontier, roofline, predicted), None when it failed early


@dataclass(frozen=True, slots=True)
class ComparisonResult:
    preset: str  # the preset whose [compare] section was measured
    result: dict  # app/talk/compare/runner.py's result: configurations, metrics, when and where measured


@dataclass(frozen=True, slots=True)
class RooflineAtLoad:
    # per loaded engine, and again as the probe goes: the roofs (None while probing, with a "status"
    # line) and the stored sweep (app/tradeoff/roofline_feed.py RoofProbe)
    payload: dict


@dataclass(frozen=True, slots=True)
class QuantError:
    """The per-layer relative weight error after requantizing: {module: ||W - Ŵ|| / ||W||}."""

    bits: int
    errors: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Quantized:
    """The weights now have `bits` bits; the KV cache was resized to `num_kv_blocks` (the bytes freed)."""

    bits: int
    num_kv_blocks: int


@dataclass(frozen=True, slots=True)
class Perplexity:
    """Measured perplexity on the held-out text, by weight bits."""

    by_bits: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LoraAdapters:
    """The adapters registered on the engine now: one dict per adapter (name, rank, targets, nbytes, source)."""

    adapters: tuple[dict, ...] = ()


@dataclass(frozen=True, slots=True)
class SideBySide:
    """One prompt sent to the base model and every adapter at once: request id -> adapter (None: base)."""

    assignments: Mapping[str, str | None] = field(default_factory=dict)
    prompt: str = ""
# --- an attached server (app/remote/source.py): what its /metrics say and what its streams measured ---
@dataclass(frozen=True, slots=True)
class ServerSample:
    """One scrape of the server's /metrics, with rates and bucket percentiles (app/remote/facts.py)."""

    facts: object  # ServerFacts


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """The connection to the attached server changed: connecting, connected, slow, down, garbage."""

    state: str
    text: str


@dataclass(frozen=True, slots=True)
class ClientSent:
    """A streaming request went out to the server (the Gantt row starts here)."""

    request_id: str
    t: float  # perf_counter


@dataclass(frozen=True, slots=True)
class ClientOutput:
    """Text that arrived on a stream, stamped on arrival; `output` carries the client-measured TTFT and
    tokens/s (no token ids: the server sends text)."""

    output: object  # engine.events.RequestOutput
    t: float
    num_tokens: int  # tokens this chunk stands for (1 per chunk)


@dataclass(frozen=True, slots=True)
class ClientFinished:
    """A stream ended: its timings as measured by the client (arrival = sent)."""

    timeline: object  # engine.events.RequestTimeline
    inter_token_s: tuple[float, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ServerRestarted:
    """A managed server's restart ended: `knobs` are the point it runs now (the one asked for, or the last
    good one when that failed), `command` its command line; `failed` says why the asked point did not
    start ("" when it did), `log_tail` the server's last log lines then."""

    knobs: Mapping[str, object]
    command: str
    failed: str = ""
    log_tail: str = ""
