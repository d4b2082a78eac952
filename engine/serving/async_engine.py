"""AsyncEngine: an asyncio front over an EngineLoop (engine/serving/loop.py); no thread of its own.

Threads
  engine loop    the one thread that steps the engine (EngineLoop). All torch work happens there.
  event loop(s)  `add_request` registers a per-request asyncio.Queue; the loop hands each RequestOutput
                 to it with `loop.call_soon_threadsafe`, so nothing of the engine runs on the event loop
                 and a slow client never slows a step.

`AsyncEngine(engine)` makes its own EngineLoop (`start()` starts it, `shutdown()` stops it): what
`inferlab serve` does. `AsyncEngine(loop=engine_loop)` subscribes to a loop someone else runs (the desktop
app's, shared with its panels and load generator): start/shutdown then only attach and detach. Either way,
when the loop rebuilds its engine, this front follows it (the requests of the old engine end first).

    aeng = AsyncEngine(engine).start()
    stream = aeng.add_request("Hello", SamplingParams(max_tokens=8))   # raises ValueError / RequestRejected
    try:
        async for out in stream:
            print(out.new_text, end="")
    finally:
        stream.close()   # aborts the request if it has not finished (e.g. the client went away)
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Sequence

from engine.events import EngineStepEvent, RequestOutput
from engine.serving.loop import EngineLoop, EngineUnavailable, FailureKind, LoopFailure, Subscriber

IDLE_WAIT_S = 0.5  # a safety net only: add_request and abort wake the thread at once


class EngineDied(RuntimeError):
    """engine.step() raised: the request cannot finish."""


class RequestStream:
    """The outputs of one request, as an async iterator that ends after the finished output."""

    def __init__(self, owner: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False
        self._owner = owner

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    async def result(self) -> RequestOutput:
        """Wait for the final output (its text and token ids are the whole generation)."""
        last = None
        async for out in self:
            last = out
        return last

    def close(self) -> None:
        """Stop listening; abort the request in the engine if it has not finished. Idempotent."""
        self._owner._unregister(self.request_id)
        if not self.finished:
            self.finished = True
            self._owner.abort(self.request_id)


class AsyncEngine(Subscriber):
    def __init__(self, engine=None, *, loop: EngineLoop | None = None, idle_wait_s: float = IDLE_WAIT_S) -> None:
        if (engine is None) == (loop is None):
            raise ValueError("AsyncEngine needs an engine or an EngineLoop, not both")
        self._owns_loop = loop is None
        self.loop = loop or EngineLoop(engine, name="inferlab-async-engine", idle_wait_s=idle_wait_s)
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.last_error: str | None = None
        self._attached = False
        self._closed = False  # shut down: add_request refuses at once (nothing would deliver its outputs)

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        """Subscribe to the loop (and start it when it is this front's own)."""
        with self._lock:
            self._closed = False
        if not self._attached:
            self._attached = True
            self.loop.subscribe(self)
        if self._owns_loop:
            self.loop.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Detach (and stop the loop when it is this front's own); every open stream ends with an error and
        add_request raises EngineUnavailable until start() again."""
        with self._lock:
            self._closed = True
        if self._owns_loop:
            self.loop.stop(timeout)
        self.loop.unsubscribe(self)
        self._attached = False
        self._fail_all(EngineDied("the engine was shut down"))

    @property
    def engine(self):
        """The engine the loop runs now (a rebuild replaces it)."""
        return self.loop.engine

    @property
    def tokenizer(self):
        return self.loop.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.loop.engine.max_model_len

    # --- requests (event-loop thread) ------------------------------------------------------------------
    def add_request(self, prompt: str | Sequence[int], params, *, request_id: str | None = None,
                    priority: int = 0, lora_name: str | None = None) -> RequestStream:
        """Queue a request now; iterate the stream for its outputs. Raises what engine.add_request raises
        (ValueError for a bad request, RequestRejected when admission control refuses it)."""
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        stream = RequestStream(self, rid, asyncio.get_running_loop())
        with self._lock:
            if self._closed:
                raise EngineUnavailable("the engine was shut down; it takes no more requests")
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            self._streams[rid] = stream  # before the engine can produce anything for it
        try:
            lora = {"lora_name": lora_name} if lora_name is not None else {}
            self.loop.add_request(prompt, params, request_id=rid, priority=priority, **lora)
        except BaseException:
            self._unregister(rid)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)

    def num_open_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def _unregister(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    # --- engine thread (Subscriber) ------------------------------------------------------------------
    def on_engine(self, engine) -> None:
        """A (re)built engine: streams still open belonged to the old one and cannot finish."""
        self._fail_all(EngineDied("the engine was rebuilt"))

    def on_error(self, failure: LoopFailure) -> None:
        if failure.kind in (FailureKind.STEP, FailureKind.LOAD):  # a bug in a step: fail the open requests
            self.last_error = failure.message
            self._fail_all(EngineDied(failure.message))

    def on_step(self, event: EngineStepEvent) -> None:
        # runs inside engine.step(): hand outputs over, never wait on a client
        with self._lock:
            for out in event.outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue  # not ours (the GUI's load generator), or its client is gone
                if out.finished:
                    del self._streams[out.request_id]
                _deliver(stream, out)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            _deliver(stream, exc)
            self.abort(stream.request_id)


def _deliver(stream: RequestStream, item) -> None:
    try:
        stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
    except RuntimeError:
        pass  # its event loop is closed: nobody is listening
