"""Admission control: refuse a request at once when the queue is too long or the wait too long.

A refused request never enters the engine (its status would be REJECTED); `add_request` raises
`RequestRejected`, which the HTTP server turns into 429 with a Retry-After header. Both limits are off
(None) by default.

The wait is *predicted*, from a simple model fed by measured steps:

    predicted_wait_s = queued_tokens / prefill_tokens_per_s + num_waiting * step_s

queued_tokens are the tokens still to prefill for every request ahead in the queue (prompts, and
prompt + output of preempted requests); prefill_tokens_per_s is an exponential moving average of
(tokens / wall time) over steps that did prefill work; step_s is the moving average of a step's wall
time, charged once per queued request because each admission costs at least part of a step even
when its prompt is tiny. Seats held by running requests (max_num_seqs) are not modelled, so under
long decodes the real wait can be longer. Until a prefill step has been measured there is no
prediction and only the queue-length limit applies.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.core.request import Request
from engine.events import StepStats

EMA_WEIGHT = 0.2  # weight of the newest step: adapts within ~10 steps, smooths one noisy step


class RequestRejected(Exception):
    """Admission control refused a request. Deliberately not a ValueError: the request was fine,
    the engine is busy; `retry_after_s` is when trying again is predicted to succeed."""

    def __init__(self, message: str, retry_after_s: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason  # "queue_full" | "predicted_wait"


@dataclass(frozen=True, slots=True)
class QueueState:
    num_waiting: int
    queued_tokens: int


class AdmissionController:
    """Holds the measured rates; `check` runs in the caller's thread, `observe` in the engine thread."""

    def __init__(self, config) -> None:
        # The two limits, its own copy (set_limits changes them); one tuple, so a check sees both at once.
        self._limits: tuple[int | None, float | None] = (config.max_queue_len, config.max_predicted_wait_s)
        self._lock = threading.Lock()
        self.num_rejected = 0  # cumulative; each StepStats carries the rejections since the last step
        self._num_rejected_published = 0
        self._queue = QueueState(0, 0)  # the queue after the last step
        self.prefill_tokens_per_s: float | None = None
        self.step_s: float | None = None

    def set_limits(self, max_queue_len: int | None, max_predicted_wait_s: float | None) -> None:
        """New limits (engine.reconfigure), for the next check."""
        self._limits = (max_queue_len, max_predicted_wait_s)

    def take_rejected(self) -> int:
        """Rejections since the last call (the engine thread, once per step)."""
        with self._lock:
            n, self._num_rejected_published = self.num_rejected - self._num_rejected_published, self.num_rejected
        return n

    def observe(self, stats: StepStats, waiting: Iterable[Request]) -> None:
        """After a step: update the moving averages and remember the queue (engine thread)."""
        queue = [r.num_tokens - r.num_computed_tokens for r in waiting]
        with self._lock:
            self._queue = QueueState(len(queue), sum(queue))
            if stats.num_tokens == 0 or stats.wall_time_s <= 0:
                return
            self.step_s = _ema(self.step_s, stats.wall_time_s)
            if stats.num_prefill_tokens:
                self.prefill_tokens_per_s = _ema(self.prefill_tokens_per_s, stats.num_tokens / stats.wall_time_s)

    def predicted_wait_s(self, num_waiting: int, queued_tokens: int) -> float | None:
        """Predicted seconds before a request queued behind these starts prefill (None: not measured yet)."""
        with self._lock:
            tps, step = self.prefill_tokens_per_s, self.step_s
        if tps is None or step is None:
            return None
        return queued_tokens / tps + num_waiting * step

    def queue(self, num_waiting_now: int | None = None, pending_tokens: Sequence[int] = ()) -> QueueState:
        """The queue a new request would join: the waiting requests (counted now when the caller can,
        else as of the last step) plus the requests added but not yet drained by the engine, one prompt
        length each in `pending_tokens` (0 for a text prompt: its tokens count once the engine thread has
        tokenized it). Queued tokens are as of the last step plus the pending prompts (the wait is a
        prediction anyway)."""
        with self._lock:
            q = self._queue
        waiting = q.num_waiting if num_waiting_now is None else num_waiting_now
        return QueueState(waiting + len(pending_tokens), q.queued_tokens + sum(pending_tokens))

    def check(self, queue: QueueState) -> None:
        """Raise RequestRejected (and count it) when one more request would break a limit."""
        try:
            self._check(queue)
        except RequestRejected:
            with self._lock:
                self.num_rejected += 1
            raise

    def _check(self, queue: QueueState) -> None:
        max_len, max_wait = self._limits
        if max_len is not None and queue.num_waiting >= max_len:
            drain = self.predicted_wait_s(queue.num_waiting, queue.queued_tokens)
            raise RequestRejected(
                f"the queue is full ({queue.num_waiting} waiting, max_queue_len={max_len}); try again later",
                _retry_after(drain), "queue_full")
        if max_wait is None:
            return
        wait = self.predicted_wait_s(queue.num_waiting, queue.queued_tokens)
        if wait is not None and wait > max_wait:
            raise RequestRejected(
                f"predicted wait {wait:.2f} s exceeds max_predicted_wait_s={max_wait:g}; try again later",
                _retry_after(wait - max_wait), "predicted_wait")


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new


def _retry_after(seconds: float | None) -> float:
    """At least one second (HTTP's Retry-After counts whole seconds); 1 s when nothing is measured."""
    return float(max(1, math.ceil(seconds))) if seconds is not None else 1.0
