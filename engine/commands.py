"""Typed engine commands: what other threads ask of the engine, queued and applied at the top of the
next step (in the engine thread, between two forward passes, so no tensor is touched mid-step).

One frozen dataclass per verb, dispatched by type (no strings to misspell). The inbox is the one
place the caller threads and the engine thread meet; `take_all` hands a whole batch over at once,
and the engine applies each command on its own, so one that fails loses none of the others.
"""
from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from engine.core.policies import make_policy
from engine.core.request import Request

if TYPE_CHECKING:
    from engine.lora.adapter import LoraAdapter

@dataclass(frozen=True, slots=True)
class Knob:
    """A run-time knob's type and range: reconfigure() checks a value against it in the caller's thread,
    so a wrong one (a float where an int belongs, a string for a bool) is refused before it can reach a
    step, where it would make every later step raise."""

    kind: type  # int, float, bool or str (an int is accepted where a float belongs; a bool never for a number)
    lo: float | None = None
    hi: float | None = None
    optional: bool = False  # None allowed (the feature off)

    def check(self, name: str, value: Any) -> Any:
        """The value as the engine stores it (a plain int / float / bool / str), or ValueError."""
        if value is None and self.optional:
            return None
        if self.kind is bool:
            ok = isinstance(value, bool)
        elif self.kind is int:
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        elif self.kind is float:
            ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
                  and math.isfinite(float(value)))
        else:
            ok = isinstance(value, self.kind)
        if not ok:
            none = " or None" if self.optional else ""
            raise ValueError(f"{name} must be {'a finite ' if self.kind is float else 'a '}{self.kind.__name__}"
                             f"{none}, got {value!r} ({type(value).__name__})")
        value = self.kind(value)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            bounds = f">= {self.lo}" if self.hi is None else f"between {self.lo} and {self.hi}"
            raise ValueError(f"{name} must be {bounds}, got {value!r}")
        return value


# The knobs reconfigure() may change between steps (the rest need a new engine), with their types and ranges.
KNOBS: Mapping[str, Knob] = MappingProxyType({
    "max_num_seqs": Knob(int, lo=1), "max_num_batched_tokens": Knob(int, lo=1),
    "enable_chunked_prefill": Knob(bool), "policy": Knob(str),
    "max_queue_len": Knob(int, lo=0, optional=True), "max_predicted_wait_s": Knob(float, lo=0, optional=True),
    "num_speculative_tokens": Knob(int, lo=0, hi=8), "spec_method": Knob(str, optional=True),
    "compile": Knob(bool), "fused_decode": Knob(bool), "int8_activations": Knob(bool),
    "cuda_graphs": Knob(bool),
})
RECONFIGURABLE = tuple(KNOBS)


@dataclass(frozen=True, slots=True)
class AddRequest:
    request: Request  # validated by add_request; its generator is made when it is drained


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True, slots=True)
class Reconfigure:
    changes: Mapping[str, Any]  # knob -> value, names from LLMEngine.RECONFIGURABLE, values validated


def reconfigure_command(changes: Mapping[str, Any]) -> Reconfigure:
    """The command for these changes, validated in the caller's thread. Raises ValueError for a knob
    that cannot change at run time or a bad value (whether a proposer can be switched to is the
    speculative decoder's to say)."""
    unknown = set(changes) - set(RECONFIGURABLE)
    if unknown:
        raise ValueError(f"cannot change {sorted(unknown)} at run time; reconfigurable: {RECONFIGURABLE}")
    changes = {name: KNOBS[name].check(name, value) for name, value in changes.items()}
    if "policy" in changes:
        make_policy(changes["policy"])
    return Reconfigure(MappingProxyType(dict(changes)))


@dataclass(frozen=True, slots=True)
class SwapWeights:
    modules: Mapping[str, Any]  # module name -> its requantized replacement (built off the engine thread)
    settings: Mapping[str, Any]  # the quant_* config fields that describe the new weights


@dataclass(frozen=True, slots=True)
class AddLora:
    adapter: LoraAdapter  # read and checked by add_lora, in the caller's thread


@dataclass(frozen=True, slots=True)
class RemoveLora:
    lora_id: int
    name: str


EngineCommand = AddRequest | AbortRequest | Reconfigure | SwapWeights | AddLora | RemoveLora


class CommandInbox:
    """Thread-safe queue of commands. Also answers the questions add_request asks under the same lock
    (is this id pending? which requests are waiting to be drained?) so they see one consistent state."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by put/take_all; add_request holds it across check + put
        self._commands: list[EngineCommand] = []

    def put(self, command: EngineCommand) -> None:
        with self.lock:
            self._commands.append(command)

    def put_locked(self, command: EngineCommand) -> None:
        """put() for a caller that already holds `lock`."""
        self._commands.append(command)

    def take_all(self) -> list[EngineCommand]:
        with self.lock:
            commands, self._commands = self._commands, []
        return commands

    def pending_requests(self) -> list[Request]:
        """Requests added but not yet drained (call with `lock` held)."""
        return [c.request for c in self._commands if isinstance(c, AddRequest)]

    def __bool__(self) -> bool:
        with self.lock:
            return bool(self._commands)
