"""What the vLLM and SGLang flag tables share: both serve a Hugging Face checkpoint, quantize the bf16 one
at load time when no checkpoint of the format is given (the format's method, app/managed/formats.py), and take
values from lists read from their sources.

A value outside an engine's list is a `FlagError` that names the accepted ones, raised before anything is
launched (the engine itself would refuse it only after seconds of start-up, or, for vLLM's metavar-only
flags, only after parsing).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.managed.formats import REFERENCE, SERVER_FORMATS
from app.managed.table import FlagError, ServedModel, ServerPoint, served_format


def checked_choice(engine: str, flag: str, value: str, accepted: Sequence[str]) -> str:
    if value not in accepted:
        raise FlagError(f"{engine} {flag} does not take {value!r}; accepted: {', '.join(accepted)}")
    return value


def positive(engine: str, knob: str, value: int) -> int:
    if value < 1:
        raise FlagError(f"{engine}: {knob} must be at least 1, not {value}")
    return value


def weights_and_quantization(engine: str, model: ServedModel, point: ServerPoint,
                             methods: Sequence[str]) -> tuple[str, list[str]]:
    """The checkpoint to serve at the point's weight format and the quantization flags it needs. A checkpoint
    given for the format wins (a quantized checkpoint names its method in its own config, so no flag);
    otherwise the bf16 checkpoint is quantized while loading with the format's `--quantization` method."""
    fmt = served_format(engine, point)
    if fmt.name in model.by_format:
        return model.weights(fmt.name), []
    if fmt.quantization is None or REFERENCE not in model.by_format:
        have = ", ".join(model.by_format) or "none"
        can = ", ".join(f"{f.name} (--quantization {f.quantization})" for f in SERVER_FORMATS
                        if engine in f.engines and f.quantization) or "none"
        raise FlagError(f"{engine}: no {fmt.name} checkpoint for {model.name or 'this model'} (have: {have}); "
                        f"online quantization of the {REFERENCE} checkpoint covers: {can}")
    return model.weights(REFERENCE), ["--quantization", checked_choice(engine, "--quantization", fmt.quantization,
                                                                      methods)]


def kv_dtype_flags(engine: str, point: ServerPoint, aliases: Mapping[str, str], accepted: Sequence[str]) -> list[str]:
    """`--kv-cache-dtype` (the same spelling on both engines); `aliases` maps the app's neutral names
    (f16, bf16, fp8) to the engine's own where they differ."""
    if point.kv_dtype is None:
        return []
    value = aliases.get(point.kv_dtype, point.kv_dtype)
    return ["--kv-cache-dtype", checked_choice(engine, "--kv-cache-dtype", value, accepted)]


def draft_length(engine: str, draft: int) -> int:
    """Draft tokens per step; 0 is off. Without a draft model both engines draft by n-gram prompt lookup
    (no extra weights), so every draft length can run."""
    return 0 if draft == 0 else positive(engine, "draft length", draft)


def served_name_flags(model: ServedModel) -> list[str]:
    """The name requests carry as "model"; without it the server answers only to the checkpoint's path."""
    return ["--served-model-name", model.name] if model.name else []


@dataclass(frozen=True, slots=True)
class EngineChoices:
    """What one engine calls the batch knob and the values it takes, as read from its source."""
    batch_flag: str
    quantization_methods: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    kv_aliases: Mapping[str, str]


def checkpoint_and_flags(engine: str, choices: EngineChoices, model: ServedModel,
                         point: ServerPoint) -> tuple[str, list[str]]:
    """The checkpoint to serve and the flags both engines spell alike: served name, batch, quantization,
    KV cache dtype."""
    checkpoint, quant = weights_and_quantization(engine, model, point, choices.quantization_methods)
    return checkpoint, [*served_name_flags(model), choices.batch_flag, str(positive(engine, "batch", point.batch)),
                        *quant, *kv_dtype_flags(engine, point, choices.kv_aliases, choices.kv_cache_dtypes)]
