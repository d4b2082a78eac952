"""One configuration point in the app's words, and the shape of one engine's flag table.

The explorer's knobs (batch, weight format, KV cache dtype, draft length, chunked prefill, prefix
caching) mean the same on every engine; each engine spells them with its own flags. A `ServerEngine`
turns a `ServerPoint` into the argv of that engine's server, and says, in `rows`, which flag carries
which knob and where that spelling was read (the engine's source file and version), so the table can
be shown and checked. A knob value an engine cannot take is a `FlagError` with the reason: the sweep
records that point as failed and goes on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

from app.managed.formats import REFERENCE, SERVER_FORMAT_BY_NAME, ServerFormat, server_format


class FlagError(ValueError):
    """A knob value this engine (or this model) cannot take; the message says why."""


@dataclass(frozen=True, slots=True)
class ServerPoint:
    """One point of a tuning sweep; None means the engine's own default."""
    batch: int = 8                       # sequences served at once (slots / max running requests)
    weight_format: str = REFERENCE       # a format's name (app/managed/formats.py): "bf16", "q4_1", "fp8", ...
    kv_dtype: str | None = None          # KV cache element type, e.g. "f16", "q8_0", "fp8"
    draft: int = 0                       # speculative draft tokens per step; 0 = off
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None

    def label(self) -> str:
        fmt = SERVER_FORMAT_BY_NAME.get(self.weight_format)
        parts = [f"batch {self.batch}", fmt.label if fmt else str(self.weight_format)]
        if self.kv_dtype:
            parts.append(f"KV {self.kv_dtype}")
        parts.append(f"draft {self.draft}" if self.draft else "no draft")
        if self.chunked_prefill is not None:
            parts.append("chunked prefill" if self.chunked_prefill else "no chunked prefill")
        if self.prefix_caching is not None:
            parts.append("prefix cache" if self.prefix_caching else "no prefix cache")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the server loads. `by_format` maps a weight format's name (app/managed/formats.py) to what that
    engine loads for it (a GGUF per format for llama.cpp, a checkpoint or HF id for vLLM/SGLang); `draft` is
    the draft model, if any."""
    by_format: dict[str, str] = field(default_factory=dict)
    draft: str | None = None
    name: str = ""                       # the name shown on points and sent as "model"

    def __post_init__(self) -> None:
        # A file whose name begins with "-" would be read as a flag: "./-x" is the same file, and no flag.
        object.__setattr__(self, "by_format", {f: as_operand(w) for f, w in self.by_format.items()})
        if self.draft:
            object.__setattr__(self, "draft", as_operand(self.draft))

    def weights(self, fmt: str) -> str:
        try:
            value = self.by_format[fmt]
        except KeyError:
            have = ", ".join(self.by_format) or "none"
            raise FlagError(f"no {fmt} weights for {self.name or 'this model'} (have: {have})") from None
        if value.startswith("-"):  # not a file here (as_operand left it): the server would read it as a flag
            raise FlagError(f"{value!r} begins with '-': the server would take it for a flag, not a model")
        return value


def served_format(engine: str, point: ServerPoint) -> ServerFormat:
    """The point's weight format, one `engine` serves; FlagError naming the ones it does."""
    try:
        return server_format(point.weight_format, engine)
    except ValueError as exc:
        raise FlagError(str(exc)) from None


def as_operand(value: str) -> str:
    """`value`, or "./value" when it is an existing relative path that begins with "-"."""
    return "./" + value if value.startswith("-") and os.path.exists(value) else value


@dataclass(frozen=True, slots=True)
class FlagRow:
    """knob -> the engine's flag, e.g. FlagRow("batch", "-np", "slots served at once")."""
    knob: str
    flag: str
    meaning: str


class ServerEngine(Protocol):
    """One engine's flag table and launch line."""
    name: str              # "llama-server", "vllm", "sglang", "inferlab"
    executable: str        # the program looked up on PATH (or given by --server-bin)
    source: str            # where the flags' spelling was read: file and version
    rows: tuple[FlagRow, ...]
    health_path: str       # answers 200 once the model is loaded

    def argv(self, exe: str, model: ServedModel, point: ServerPoint, port: int,
             threads: int | None = None) -> list[str]:
        """The full command line serving `model` at `point` on 127.0.0.1:port; FlagError if impossible."""
        ...
