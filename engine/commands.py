"""Typed engine commands: what other threads ask of the engine, queued and applied at the top of the
next step (in the engine thread, between two forward passes, so no tensor is touched mid-step).

One frozen dataclass per verb, dispatched by type (no strings to misspell). The inbox is the one
place the caller threads and the engine thread meet; `take_all` hands a whole batch over at once,
and the engine applies each command on its own, so one that fails loses none of the others.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from engine.core.request import Request
from engine.knobs import KNOB
from engine.knobs import RECONFIGURABLE as RECONFIGURABLE  # what reconfigure() may change: knobs run_time

if TYPE_CHECKING:
    from engine.lora.adapter import LoraAdapter



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
    # each value against its knob's type and range or list, stored as a plain value
    return Reconfigure(MappingProxyType({name: KNOB[name].check(value) for name, value in changes.items()}))


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
