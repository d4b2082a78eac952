"""Request: one prompt's journey through the engine, as token counts the scheduler can reason about."""
from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

from engine.sampling_params import SamplingParams
from engine.token_ids import AppendOnlyIds

if TYPE_CHECKING:
    from engine.core.detokenizer import IncrementalDetokenizer


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # lost its KV blocks; waits to be recomputed
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"
    REJECTED = "rejected"

    @property
    def finished(self) -> bool:
        # by value: a member's hash is Enum.__hash__, a Python call (read per request per step)
        return self._value_ in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return self._value_ if self._value_ in _FINISHED else None


_FINISHED = frozenset(s.value for s in (
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_ERROR,
    RequestStatus.REJECTED,
))


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.perf_counter)
    priority: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # only grows (AppendOnlyIds): every RequestOutput handed out shares it through a TokenIds view
    output_token_ids: list[int] = field(default_factory=AppendOnlyIds)
    # Tokens whose K/V sit in the cache. Prefill and decode are the same thing: this count catching
    # up with num_tokens. A preempted request falls back to 0 and catches up again.
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, found in the prefix cache at admission
    num_preemptions: int = 0
    # Draft tokens proposed for this step's verification; they are not part of the request's tokens
    # until the target accepts them.
    spec_token_ids: list[int] = field(default_factory=list)
    # When the drafts form a tree (multi-token prediction): the parent row of each draft, where row 0 is
    # the last known token and row i the i-th draft; parents come before children. Empty: a chain.
    spec_tree: list[int] = field(default_factory=list)
    mtp_hidden: object | None = None  # the final hidden state that produced the last token (MTP heads read it)
    detokenizer: IncrementalDetokenizer | None = None
    seed: int = 0
    generator: object | None = None  # the sampler's per-request RNG (a torch.Generator)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    error: str | None = None
    lora_name: str | None = None  # the LoRA adapter this request runs with (None: the base model)
    lora_id: int = 0  # its id in the adapter pool (0: base); part of the prefix hash of its KV blocks

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def in_prompt(self) -> bool:
        """Prompt tokens are still to be computed (what the next step computes is, at least in part, a prefill)."""
        return self.num_computed_tokens < len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def tokens(self) -> RequestTokens:
        """prompt + output as a sequence that builds no list: a slice reads only its own tokens (the prefix
        cache hashes each block as it fills; all_token_ids copied every token so far each time)."""
        return RequestTokens(self)

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) without building the whole prompt + output list (a per-step hot path)."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def token_id_at(self, pos: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[pos] if pos < n else self.output_token_ids[pos - n]

    @property
    def is_prefill(self) -> bool:
        """True while the prompt (or, after preemption, prompt + output) is being caught up."""
        return self.num_tokens - self.num_computed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status.finished


class RequestTokens(Sequence[int]):
    """A request's prompt + output tokens, read in place (Request.tokens)."""

    __slots__ = ("_req",)

    def __init__(self, req: Request) -> None:
        self._req = req

    def __len__(self) -> int:
        return self._req.num_tokens

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            return self._req.token_slice(start, max(start, stop)) if step == 1 else self._req.all_token_ids[i]
        if not -n <= i < n:
            raise IndexError("token index out of range")
        return self._req.token_id_at(i % n)
