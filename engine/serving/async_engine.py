"""AsyncEngine: one LLMEngine stepped by one background thread, consumed from asyncio.

Threads
  engine thread  steps while there is work, else waits on an Event that add/abort set (never a busy
                 loop). All torch work happens here.
  event loop(s)  `add_request` registers a per-request asyncio.Queue; the engine listener hands each
                 RequestOutput to it with `loop.call_soon_threadsafe`, so nothing of the engine runs on
                 the loop and a slow client never slows a step.

Driver: by default AsyncEngine starts and owns the engine thread. When another thread already steps
the engine (the desktop app's EngineHost), pass `driver=host`: anything with
`add_request(prompt, params, request_id=, priority=)` and `abort(request_id)` that queue the command and
wake that thread. Outputs arrive through the same engine listener either way.

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


class AsyncEngine:
    def __init__(self, engine, *, driver=None, idle_wait_s: float = IDLE_WAIT_S) -> None:
        self.engine = engine
        self._driver = driver
        self._idle_wait_s = idle_wait_s
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self.last_error: str | None = None
        engine.add_listener(self._on_step)

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        """Start the engine thread (not with a driver: its thread steps the engine)."""
        if self._driver is None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inferlab-async-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread (after the step in flight) and end every open stream with an error."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.engine.remove_listener(self._on_step)
        self._fail_all(EngineDied("the engine was shut down"))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    # --- requests (event-loop thread) ------------------------------------------------------------------
    def add_request(self, prompt: str | Sequence[int], params, *, request_id: str | None = None,
                    priority: int = 0) -> RequestStream:
        """Queue a request now; iterate the stream for its outputs. Raises what engine.add_request raises
        (ValueError for a bad request, RequestRejected when admission control refuses it)."""
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        stream = RequestStream(self, rid, asyncio.get_running_loop())
        with self._lock:
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            self._streams[rid] = stream  # before the engine can produce anything for it
        try:
            (self._driver or self.engine).add_request(prompt, params, request_id=rid, priority=priority)
        except BaseException:
            self._unregister(rid)
            raise
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        (self._driver or self.engine).abort(request_id)
        self._wake.set()

    def num_open_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def _unregister(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    # --- engine thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        if getattr(self.engine.config, "num_threads", None):
            import torch  # torch's CPU thread count is per OS thread: set it in the one that steps

            torch.set_num_threads(self.engine.config.num_threads)
        while not self._stop.is_set():
            self._wake.clear()  # before the check, so a wake-up between check and wait is not lost
            if self.engine.has_unfinished():
                try:
                    self.engine.step()
                except Exception as exc:  # a bug in a step: fail the open requests, keep serving
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    self._fail_all(EngineDied(self.last_error))
                    self._stop.wait(0.1)
            else:
                self._wake.wait(self._idle_wait_s)

    def _on_step(self, event: EngineStepEvent) -> None:
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
