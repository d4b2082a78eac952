"""One streaming request to an OpenAI-compatible server, timed on arrival (client-side facts).

`stream_request` sends a streaming /v1/completions (or /v1/chat/completions) request and stamps every
content chunk with perf_counter as it arrives: TTFT is send -> first content, inter-token times are the
gaps between chunks, the token count is the server's `usage` when it reports one (stream_options), else
the number of content chunks (servers send one per decode step). Cancelling the task closes the
stream, which is how a client aborts a request on vLLM, SGLang, llama.cpp and inferlab alike.

The server is not trusted: lines and the whole stream are bounded in size and time (app/remote/bounded.py),
and a chunk whose fields have the wrong types (a delta that is not an object, a usage count that is not a
count) ends the request with an error that names the field, never a request that does not finish. A stream
brings at most what its request asked for (StreamLimits: text chunks for max_tokens, their characters, bytes
on the wire), and the streams of one client together at most a StreamBudget: a server streaming tiny events
without end took the app to 4 GB before.
"""
from __future__ import annotations

import asyncio
import json
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from app.remote import bounded
from app.remote.bounded import IDENTITY, ReadLimit, head, lines
from engine.sampling_params import REQUEST_DEFAULTS, REQUEST_FIELDS

MAX_ERROR_CHARS = 300
MAX_COUNT = 2**31  # a token count beyond this is not a count
CHUNK_SLACK = 8  # text chunks past max_tokens still taken (a server sends one a token, or fewer)
MAX_CHARS_PER_TOKEN = 256  # a token's text is a few characters, rarely dozens
WIRE_BYTES_PER_TOKEN = 16 * 1024  # one token's event on the wire, its JSON and logprobs included
MIN_WIRE_BYTES = 256 * 1024  # a stream's head room: role chunk, usage, keep-alive comments
TOTAL_CHUNKS = 1_000_000  # text chunks all streams of one budget hold together (~10-100 MB with their text)
TOTAL_CHARS = 32 * 2**20  # their text characters together


class BadChunk(ValueError):
    """A stream chunk with a field of the wrong type, or past a limit (the message names it)."""


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What one stream may bring, from what its request asked for."""

    max_tokens: int
    max_chunks: int  # text chunks
    max_chars: int  # their characters
    max_bytes: int  # on the wire, every event and comment included

    @classmethod
    def asked(cls, body: dict) -> StreamLimits:
        n = body.get("max_tokens")
        n = min(n, MAX_COUNT) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 16
        return cls(n, n + CHUNK_SLACK, n * MAX_CHARS_PER_TOKEN,
                   min(bounded.MAX_STREAM_BYTES, MIN_WIRE_BYTES + n * WIRE_BYTES_PER_TOKEN))


class StreamBudget:
    """What the streams of one client hold together (text chunks and characters): each stream's own
    limits times 256 streams in flight could still reach gigabytes. One event loop uses it: no lock."""

    def __init__(self, max_chunks: int | None = None, max_chars: int | None = None) -> None:
        self.max_chunks = TOTAL_CHUNKS if max_chunks is None else max_chunks
        self.max_chars = TOTAL_CHARS if max_chars is None else max_chars
        self.chunks = self.chars = 0

    def take(self, chars: int) -> bool:
        """One more text chunk of `chars` characters: False (nothing taken) when it does not fit."""
        if self.chunks + 1 > self.max_chunks or self.chars + chars > self.max_chars:
            return False
        self.chunks += 1
        self.chars += chars
        return True

    def give_back(self, res: StreamResult) -> None:
        self.chunks -= len(res.chunk_times)
        self.chars -= res.num_chars


@dataclass(slots=True)
class StreamResult:
    request_id: str
    sent: float = 0.0  # perf_counter when the request went out
    first_token: float | None = None
    finished: float | None = None
    chunk_times: array = field(default_factory=lambda: array("d"))  # arrival of each text chunk
    pieces: list[str] = field(default_factory=list)  # the text, chunk by chunk (joined once, by `text`)
    num_chars: int = 0
    completion_tokens: int | None = None  # from the server's usage
    prompt_tokens: int | None = None
    finish_reason: str | None = None  # stop | length | abort | error | rejected
    error: str | None = None
    status: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def num_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    def inter_token_s(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    def tokens_per_s(self) -> float | None:
        """Decode rate so far: (tokens - 1) over first to last chunk (as the engine reports its own)."""
        t = self.chunk_times
        if len(t) < 2 or t[-1] <= t[0]:
            return None
        return (max(self.num_tokens, len(t)) - 1) / (t[-1] - t[0])


def request_body(model: str, prompt: str, *, max_tokens: int, temperature: float, chat: bool,
                 **sampling) -> tuple[str, dict]:
    """(path, JSON body) of a streaming request. `sampling`: more SamplingParams fields by name (seed,
    ignore_eos, top_p, ...: engine.sampling_params.REQUEST_FIELDS), each sent only when it is not the
    engine's default, so a server is never told a field it may not know without need; `ignore_eos` is the
    extension vLLM, SGLang, llama.cpp and inferlab share (a fixed amount of work per request, for
    benchmarks). The temperature is always sent: servers' own defaults differ (llama.cpp's is 0.8)."""
    unknown = sorted(set(sampling) - set(REQUEST_FIELDS))
    if unknown:
        raise TypeError(f"request_body: not a request field: {', '.join(unknown)}")
    body: dict = {"model": model, "max_tokens": int(max_tokens), "temperature": float(temperature), "stream": True,
                  "stream_options": {"include_usage": True}}
    body.update({name: value for name, value in sampling.items() if value != REQUEST_DEFAULTS[name]})
    if chat:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


def sampling_of(params) -> dict:
    """A SamplingParams as the keyword arguments a request is sent with: max_tokens and every request field
    (engine.sampling_params.REQUEST_FIELDS), the shape of a load generator arrival's `sampling` too."""
    return {"max_tokens": params.max_tokens, **{name: getattr(params, name) for name in REQUEST_FIELDS}}


def sampled_request_body(model: str, prompt: str, sampling: dict, chat: bool) -> tuple[str, dict]:
    """request_body from SamplingParams keyword arguments (sampling_of, or an arrival's `sampling`): every
    request field among them travels; without one, max_tokens 16 and temperature 0.8."""
    fields = {name: sampling[name] for name in REQUEST_FIELDS if name in sampling and name != "temperature"}
    return request_body(model, prompt, max_tokens=sampling.get("max_tokens") or 16,
                        temperature=sampling.get("temperature", 0.8), chat=chat, **fields)


def _chunk_text(chunk: dict) -> tuple[str, str | None]:
    """(new text, finish_reason) of one stream chunk, completions or chat; BadChunk for a wrong type."""
    choices = chunk.get("choices")
    if choices is None or choices == []:
        return "", None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise BadChunk("choices is not a list of objects")
    c = choices[0]
    text = c.get("text")
    if text is None:
        delta = c.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise BadChunk("delta is not an object")
        text = (delta or {}).get("content")
    if text is not None and not isinstance(text, str):
        raise BadChunk("the chunk's text is not a string")
    reason = c.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise BadChunk("finish_reason is not a string")
    return text or "", reason[:40] if reason else None


def _count(usage: dict, key: str, old: int | None) -> int | None:
    value = usage.get(key)
    if value is None:
        return old
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise BadChunk(f"usage.{key} is not a token count: {str(value)[:40]!r}")
    return value


def _apply_chunk(res: StreamResult, data: str, t: float, on_text, limits: StreamLimits,
                 budget: StreamBudget) -> bool:
    """One `data:` payload into `res`; False when it ends the request (an error it carries or causes)."""
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):
        res.finish_reason, res.error = "error", f"not JSON in the stream: {data[:80]!r}"
        return False
    if not isinstance(chunk, dict):
        return True
    if "error" in chunk:
        said = str(chunk["error"])[:MAX_ERROR_CHARS]  # an empty error is still an error, with words
        res.finish_reason, res.error = "error", said or "the server sent an error with no message"
        return False
    try:
        usage = chunk.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise BadChunk("usage is not an object")
        if usage:
            res.completion_tokens = _count(usage, "completion_tokens", res.completion_tokens)
            res.prompt_tokens = _count(usage, "prompt_tokens", res.prompt_tokens)
        text, reason = _chunk_text(chunk)
    except BadChunk as exc:
        res.finish_reason, res.error = "error", f"a malformed chunk in the stream: {exc}"
        return False
    if text:
        over = _over(res, len(text), limits, budget)
        if over:
            res.finish_reason, res.error = "error", over
            return False
        if res.first_token is None:
            res.first_token = t
        res.chunk_times.append(t)
        res.pieces.append(text)
        res.num_chars += len(text)
        if on_text is not None:
            on_text(res, text, t)
    res.finish_reason = reason or res.finish_reason
    return True


def _over(res: StreamResult, chars: int, limits: StreamLimits, budget: StreamBudget) -> str | None:
    """Why one more text chunk of `chars` characters is one too many (None: it fits, and is taken)."""
    if len(res.chunk_times) >= limits.max_chunks:
        return (f"the server sent more than {limits.max_chunks:,} text chunks for max_tokens {limits.max_tokens:,} "
                "(one a token, or fewer)")
    if res.num_chars + chars > limits.max_chars:
        return (f"the server sent more than {limits.max_chars:,} characters for max_tokens {limits.max_tokens:,} "
                f"({MAX_CHARS_PER_TOKEN} a token)")
    if not budget.take(chars):
        return (f"the streams in flight together went over {budget.max_chunks:,} text chunks or "
                f"{budget.max_chars // 2**20} Mi characters")
    return None


async def stream_request(client: httpx.AsyncClient, base_url: str, path: str, body: dict, res: StreamResult, *,
                         headers: dict | None = None,
                         on_text: Callable[[StreamResult, str, float], None] | None = None,
                         budget: StreamBudget | None = None) -> StreamResult:
    """Send one streaming request; `on_text(result, new_text, t)` for every content chunk as it arrives.
    A refusal (429, 4xx, 5xx), a dropped connection, garbage in the stream or more than the request asked
    for (StreamLimits; `budget`: what this stream and the others sharing it hold together) ends it with an
    error; cancelling the task closes the stream (an abort) and re-raises, `res` then says "abort".
    `res.sent` is stamped here, as the request goes out; `res`'s share of the budget is given back at the end."""
    res.sent = time.perf_counter()
    limits = StreamLimits.asked(body)
    budget = StreamBudget() if budget is None else budget
    try:
        async with client.stream("POST", base_url + path, json=body, headers={**IDENTITY, **(headers or {})}) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                detail = (await head(resp))[:MAX_ERROR_CHARS]
                res.finish_reason = "rejected" if resp.status_code == 429 else "error"
                res.error = f"HTTP {resp.status_code}: {detail}"
                return res
            async for line in lines(resp, max_total_bytes=limits.max_bytes):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                if not _apply_chunk(res, data, time.perf_counter(), on_text, limits, budget):
                    return res
    except asyncio.CancelledError:
        res.finish_reason, res.finished = "abort", time.perf_counter()
        raise
    except ReadLimit as exc:
        res.finish_reason, res.error = "error", f"the server's stream went over a limit: {exc}"[:MAX_ERROR_CHARS]
    except httpx.HTTPError as exc:
        res.finish_reason, res.error = "error", f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    finally:
        budget.give_back(res)
        if res.finished is None:
            res.finished = time.perf_counter()
    res.finish_reason = res.finish_reason or "stop"
    return res
