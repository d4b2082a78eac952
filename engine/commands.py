"""Typed engine commands and the one queue they travel through.

What other threads ask of the engine is a frozen dataclass, one per verb, dispatched by type (no strings to
misspell), and put into ONE `CommandQueue`: the EngineLoop's when a loop runs the engine (the loop's own
commands, Rebuild, AbortAll, the app's host commands, share it), else the engine's own (offline: `generate`,
tests and benches calling `step()`). The engine takes its commands (`ENGINE_COMMANDS`) at the top of each
step, in the engine thread, between two forward passes; the loop takes the others between steps. Each
consumer takes its own kinds in the order they were put, so commands keep their order per sender.

An AddRequest carries the prompt as given (text or token ids), already checked by the pure validators
(engine/validation.py): the heavy part, tokenizing and building the Request, runs in the engine thread.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.lora.adapter import LoraAdapter


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    prompt: str | tuple[int, ...]  # text is tokenized in the engine thread, when the command is drained
    params: SamplingParams  # validated
    priority: int = 0
    lora_name: str | None = None
    lora_id: int = 0  # resolved from lora_name when the request was added (0: the base model)
    chat: bool = False  # text: rendered through the model's chat template first (engine thread)
    arrival_time: float = field(default_factory=time.perf_counter)  # the request's clock starts when it is added

    @property
    def num_prompt_tokens(self) -> int | None:
        """Known for token ids; None for text until the engine thread tokenizes it."""
        return None if isinstance(self.prompt, str) else len(self.prompt)


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True, slots=True)
class Reconfigure:
    changes: Mapping[str, Any]  # knob -> value, checked by engine.validation.check_reconfigure


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
ENGINE_COMMANDS: tuple[type, ...] = (AddRequest, AbortRequest, Reconfigure, SwapWeights, AddLora, RemoveLora)


class CommandQueue:
    """The thread-safe FIFO between the threads that ask and the one that runs the engine. `lock` also lets
    add_request ask its questions (is this id pending? how long is the queue?) and put in one consistent
    state. Every put wakes a waiting owner (`wait`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._commands: deque = deque()
        self._ready = threading.Event()

    def put(self, command) -> None:
        with self.lock:
            self.put_locked(command)

    def put_locked(self, command) -> None:
        """put() for a caller that already holds `lock`."""
        self._commands.append(command)
        self._ready.set()

    def take(self, kinds: tuple[type, ...], *, others: bool = False) -> list:
        """Remove and return the commands of these kinds (`others`: of every other kind), oldest first; the
        rest stay queued in their order."""
        with self.lock:
            taken = [c for c in self._commands if isinstance(c, kinds) != others]
            if taken:
                self._commands = deque(c for c in self._commands if isinstance(c, kinds) == others)
        return taken

    def pending(self, kind: type) -> list:
        """The queued commands of this kind (call with `lock` held)."""
        return [c for c in self._commands if isinstance(c, kind)]

    def has(self, kinds: tuple[type, ...], *, others: bool = False) -> bool:
        with self.lock:
            return any(isinstance(c, kinds) != others for c in self._commands)

    def __bool__(self) -> bool:
        with self.lock:
            return bool(self._commands)

    # --- waking the owner --------------------------------------------------------------------------
    def wake(self) -> None:
        """Wake a waiting owner without a command (stop, a request counted elsewhere)."""
        self._ready.set()

    def clear_wake(self) -> None:
        """Before the owner checks for work: a put between this and wait() is not lost."""
        self._ready.clear()

    def wait(self, timeout: float) -> None:
        self._ready.wait(timeout)
