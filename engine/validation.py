"""Pure validators: what the engine checks before it queues a request or a reconfigure, as functions any
caller may run first (the GUI, an HTTP handler) to answer at once, with no engine and no thread of its own.

The engine runs the same functions in `add_request` / `reconfigure` (a bad request fails alone, with this
message, before it is queued) and again in the engine thread once a text prompt is tokenized (its length
is known only then). Torch-free, tokenizer-free: they read only the prompt, the parameters and limits.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from engine.events import SpecMethod
from engine.knobs import KNOB, RECONFIGURABLE
from engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What a request is checked against: the model's vocabulary and the engine's context length."""

    vocab_size: int
    max_model_len: int


def validate_request(prompt: str | Sequence[int], params: SamplingParams | None,
                     limits: RequestLimits) -> str | None:
    """What is wrong with this request, or None when it may be queued. A text prompt is checked for what is
    known before tokenizing (not empty; max_tokens leaves room for at least one prompt token)."""
    params = params or SamplingParams()
    try:
        params.validate()
    except ValueError as exc:
        return str(exc)
    if isinstance(prompt, str):
        return "the prompt is empty" if not prompt else _length_problem(1, params, limits, "at least 1 token")
    try:
        ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        return "prompt token ids must be integers"
    if not ids:
        return "the prompt is empty"
    if any(t < 0 or t >= limits.vocab_size for t in ids):
        return f"prompt token ids must lie in [0, {limits.vocab_size})"
    return _length_problem(len(ids), params, limits, f"{len(ids)} tokens")


def _length_problem(num_prompt_tokens: int, params: SamplingParams, limits: RequestLimits, told: str) -> str | None:
    if num_prompt_tokens + params.max_tokens <= limits.max_model_len:
        return None
    return (f"prompt ({told}) plus max_tokens ({params.max_tokens}) exceeds the context length of "
            f"{limits.max_model_len} tokens")


def check_request(prompt: str | Sequence[int], params: SamplingParams | None, limits: RequestLimits) -> None:
    """validate_request, raising ValueError with its message."""
    problem = validate_request(prompt, params, limits)
    if problem is not None:
        raise ValueError(problem)


def check_reconfigure(config, changes: Mapping[str, Any]) -> Mapping[str, Any]:
    """The changes as the engine stores them (each value against its knob's type and range or list), for an
    engine built with `config` (an EngineConfig). Raises ValueError for a knob that cannot change at run time,
    a bad value, or a speculation method that needs a new engine: at run time the proposer switches between
    none and n-gram lookup, or stays as it is (a draft model or MTP heads load only at start-up)."""
    unknown = set(changes) - set(RECONFIGURABLE)
    if unknown:
        raise ValueError(f"cannot change {sorted(unknown)} at run time; reconfigurable: {RECONFIGURABLE}")
    checked = {name: KNOB[name].check(value) for name, value in changes.items()}
    method = checked.get("spec_method", config.spec_method)
    if method not in (None, SpecMethod.NGRAM, config.spec_method):
        raise ValueError(f"cannot switch speculation to '{method}' at run time; start the engine with it")
    return MappingProxyType(checked)
