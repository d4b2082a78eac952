"""Bounded reads from a server we do not trust: a size and a total time for every body, a size and a
time for every line of a stream.

httpx bounds each socket read, not a body: a /metrics page that never ends grows without bound, and one
sent a byte a second never times out (each byte restarts the read timeout). A monitor must survive the
thing it monitors, so every read here stops at a limit and says which (ReadLimit), and the caller turns
that into a status the user sees.

Compression is unpacked here, never by httpx: httpx unpacks a whole chunk before a size cap can look at it,
so 2 KB of gzip-of-gzip became 1 GiB in memory. Every request asks for the body as it is (IDENTITY); a
server that packs it anyway gets one gzip or deflate layer unpacked UNPACK_PIECE bytes at a time (the
callers' caps then hold), and any other coding (br, zstd, two layers) is refused by name.
"""
from __future__ import annotations

import asyncio
import json as jsonlib
import zlib
from collections.abc import AsyncIterator

import httpx

MAX_LINE_BYTES = 1 * 2**20  # one SSE line: a token's chunk is a few hundred bytes
LINE_TIMEOUT_S = 30.0  # a line that has begun arriving must end within this
MAX_STREAM_BYTES = 32 * 2**20  # one whole stream (~100k tokens' chunks)
STREAM_TOTAL_S = 3600.0  # one whole stream
MAX_ERROR_BYTES = 4096  # what an error answer's body may show
IDENTITY = {"Accept-Encoding": "identity"}  # every request: the body as it is, unpacked by no one
UNPACK_PIECE = 64 * 1024  # a packed body is unpacked at most this much at a time
UNPACKED = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # Content-Encoding -> zlib's wbits


class ReadLimit(Exception):
    """A body or line went over its size or time limit (the message says which; `too_slow`: time)."""

    def __init__(self, message: str, too_slow: bool = False) -> None:
        super().__init__(message)
        self.too_slow = too_slow


def size(n: int) -> str:
    """A byte count as a limit is said."""
    return f"{n // 1024:,} KiB"


async def fetch(client: httpx.AsyncClient, url: str, *, max_bytes: int, total_s: float, method: str = "GET",
                json: dict | None = None) -> tuple[int, bytes]:
    """GET `url` (or `method` with a `json` body): (status, body); ReadLimit when the body is larger than
    `max_bytes` or the whole answer takes longer than `total_s`. httpx errors (refused, reset) pass through."""
    try:
        async with asyncio.timeout(total_s):
            async with client.stream(method, url, json=json, timeout=total_s, headers=IDENTITY) as resp:
                body = bytearray()
                async for chunk in body_bytes(resp):
                    body += chunk
                    if len(body) > max_bytes:
                        raise ReadLimit(f"{url} sent more than {size(max_bytes)}")
                return resp.status_code, bytes(body)
    except TimeoutError:
        raise ReadLimit(f"{url} did not finish its answer within {total_s:g} s", too_slow=True) from None


async def fetch_json(client: httpx.AsyncClient, url: str, *, what: str, max_bytes: int, total_s: float,
                     method: str = "GET", json: dict | None = None):
    """fetch's answer parsed as JSON; ValueError naming `what` for a limit, a status other than 200 or an
    answer that is not JSON. httpx errors pass through."""
    try:
        status, data = await fetch(client, url, max_bytes=max_bytes, total_s=total_s, method=method, json=json)
    except ReadLimit as exc:
        raise ValueError(f"{what}: {exc}") from None
    if status != 200:
        raise ValueError(f"{what} answered HTTP {status}: {data[:200].decode('utf-8', 'replace')}")
    try:
        return jsonlib.loads(data)
    except (ValueError, RecursionError):
        raise ValueError(f"{what} is not JSON: {data[:120].decode('utf-8', 'replace')!r}") from None


async def head(resp: httpx.Response, max_bytes: int = MAX_ERROR_BYTES, total_s: float = 5.0) -> str:
    """At most the first `max_bytes` of a body (an error's detail), within `total_s`; never more."""
    out = bytearray()
    try:
        async with asyncio.timeout(total_s):
            async for chunk in body_bytes(resp):
                out += chunk
                if len(out) >= max_bytes:
                    break
    except (TimeoutError, ReadLimit):
        pass
    return out[:max_bytes].decode("utf-8", "replace")


async def lines(resp: httpx.Response, *, max_line_bytes: int | None = None, line_s: float | None = None,
                max_total_bytes: int | None = None, total_s: float | None = None) -> AsyncIterator[str]:
    """The lines of a streamed body (SSE), decoded; ReadLimit when a line grows beyond `max_line_bytes`
    or takes longer than `line_s` from its first byte, or the stream beyond `max_total_bytes` / `total_s`
    (None: this module's limits, read at the call). The wait between lines is the client's read timeout
    (a queued request may wait long for a token)."""
    max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    line_s = LINE_TIMEOUT_S if line_s is None else line_s
    max_total_bytes = MAX_STREAM_BYTES if max_total_bytes is None else max_total_bytes
    total_s = STREAM_TOTAL_S if total_s is None else total_s
    loop = asyncio.get_running_loop()
    end = loop.time() + total_s
    chunks = body_bytes(resp).__aiter__()
    pending = bytearray()
    line_deadline: float | None = None
    total = 0
    while True:
        deadline = end if line_deadline is None else min(end, line_deadline)
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            break
        except TimeoutError:
            what = "the stream" if line_deadline is None or end <= line_deadline else "a line of the stream"
            raise ReadLimit(f"{what} took longer than {total_s if what == 'the stream' else line_s:g} s") from None
        total += len(chunk)
        if total > max_total_bytes:
            raise ReadLimit(f"the stream sent more than {size(max_total_bytes)}")
        pending += chunk
        if b"\n" in chunk:  # (pending held no newline before: only a chunk with one can end a line)
            *complete, rest = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
            pending = bytearray(rest)
            line_deadline = loop.time() + line_s if pending else None  # a line began in this chunk
        elif line_deadline is None:  # a line begins: its clock starts now
            line_deadline = loop.time() + line_s
        if len(pending) > max_line_bytes:
            raise ReadLimit(f"a line of the stream is longer than {size(max_line_bytes)}")
    if pending:
        yield pending.decode("utf-8", "replace")


async def body_bytes(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The body's bytes, unpacked here a bounded piece at a time (never more than UNPACK_PIECE per piece):
    as sent when it is not packed, one gzip or deflate layer unpacked; ReadLimit naming any other coding."""
    codings = [c.strip().lower() for c in resp.headers.get("content-encoding", "").split(",")]
    codings = [c for c in codings if c not in ("", "identity")]
    if not codings:
        async for chunk in resp.aiter_raw():
            yield chunk
        return
    if len(codings) > 1 or codings[0] not in UNPACKED:
        raise ReadLimit(f"the answer is packed as {', '.join(codings)[:80]!r} (asked for identity; at most one "
                        "gzip or deflate layer is unpacked)")
    unpack = zlib.decompressobj(UNPACKED[codings[0]])
    async for chunk in resp.aiter_raw():
        data = chunk
        while True:  # until this chunk is consumed and its output drained, a bounded piece at a time
            try:
                piece = unpack.decompress(data, UNPACK_PIECE)
            except zlib.error as exc:
                raise ReadLimit(f"the answer is not valid {codings[0]} ({exc})") from None
            if piece:
                yield piece
            data = unpack.unconsumed_tail
            if not data and len(piece) < UNPACK_PIECE:
                break
