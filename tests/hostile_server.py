"""A hostile HTTP server on 127.0.0.1 for the attach tests: each path answers with a scripted behaviour
(a body that never ends, one byte at a time, a line with no end, values of the wrong type). It runs an
asyncio loop in a thread of its own; every behaviour stops when the client goes away or the server stops,
and none runs longer than MAX_BEHAVIOUR_S, so a test can never leave it running."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import time
import zlib
from collections.abc import Awaitable, Callable

MAX_BEHAVIOUR_S = 30.0
Behaviour = Callable[[asyncio.StreamWriter], Awaitable[None]]


def head(content_type: str = "text/plain", length: int | None = None, status: int = 200) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def body(data: bytes | str, content_type: str = "text/plain", status: int = 200) -> Behaviour:
    """A whole answer at once."""
    data = data.encode() if isinstance(data, str) else data

    async def send(w: asyncio.StreamWriter) -> None:
        w.write(head(content_type, len(data), status) + data)
        await w.drain()
    return send


def endless(chunk: bytes = b"x" * 65536, prefix: bytes = b"", content_type: str = "text/plain") -> Behaviour:
    """A body that never ends (no length, no newline unless `chunk` has one)."""
    async def send(w: asyncio.StreamWriter) -> None:
        w.write(head(content_type) + prefix)
        while True:
            w.write(chunk)
            await w.drain()
            await asyncio.sleep(0)
    return send


def trickle(data: bytes, every_s: float = 0.25, content_type: str = "text/plain") -> Behaviour:
    """A body sent one byte at a time."""
    async def send(w: asyncio.StreamWriter) -> None:
        w.write(head(content_type, len(data)))
        for byte in data:
            w.write(bytes([byte]))
            await w.drain()
            await asyncio.sleep(every_s)
    return send


def packed(data: bytes, coding: str = "gzip", content_type: str = "text/plain") -> Behaviour:
    """A whole answer whose body is sent as `data` under Content-Encoding `coding` (packed or not)."""
    async def send(w: asyncio.StreamWriter) -> None:
        w.write(head(content_type, len(data)).replace(b"\r\n\r\n", f"\r\nContent-Encoding: {coding}\r\n\r\n".encode())
                + data)
        await w.drain()
    return send


@functools.cache
def gzip_of_zeros(n_bytes: int, wbits: int = 31) -> bytes:
    """gzip (zlib's wrapping for `wbits` 15) of `n_bytes` zero bytes, made a MiB at a time (1 GiB packs to
    ~1 MB)."""
    pack = zlib.compressobj(9, zlib.DEFLATED, wbits)
    out = [pack.compress(bytes(2**20)) for _ in range(n_bytes // 2**20)]
    return b"".join(out) + pack.compress(bytes(n_bytes % 2**20)) + pack.flush()


def sse(*payloads, done: bool = True) -> Behaviour:
    """An SSE stream of these payloads (dicts are JSON-encoded, strings sent as they are)."""
    events = b"".join(f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n".encode() for p in payloads)
    return body(events + (b"data: [DONE]\n\n" if done else b""), "text/event-stream")


class HostileServer:
    def __init__(self, routes: dict[str, Behaviour]) -> None:
        self.routes = dict(routes)
        self.heads: list[bytes] = []  # every request's head, as it came
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-http", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        assert self._ready.wait(10), "the hostile server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop)
        self._thread.join(10)

    def _stop(self) -> None:
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._server.close()
        self._loop.call_later(0.05, self._loop.stop)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            self.heads.append(request)
            path = request.split(b" ", 2)[1].decode()
            length = next((int(line.split(b":")[1]) for line in request.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if length:
                await reader.readexactly(length)
            behaviour = self.routes.get(path, body(b"not here", status=404))
            await asyncio.wait_for(behaviour(writer), MAX_BEHAVIOUR_S)
        with contextlib.suppress(Exception):
            writer.close()


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
