"""From engine outputs to OpenAI responses: collect (non-streaming) or SSE (streaming), per choice.

Every choice is one engine request. The engine's RequestOutput deltas already hold back incomplete
UTF-8 and text that may still become a stop string, so what is streamed never has to be taken back,
and the streamed deltas add up to exactly the non-streamed text.

Cleanup: whatever ends the response (done, error, the client going away, which cancels the task that
runs these generators), the `finally` closes every stream, and closing an unfinished stream aborts
its request, which frees its KV blocks within a step.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from app.server import formats
from app.server.errors import APIError
from engine.events import RequestOutput, TokenLogprob
from engine.serving.async_engine import EngineDied, RequestStream


@dataclass(slots=True)
class Choice:
    """What one choice has produced so far."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str | None = None
    offset: int = 0  # characters of token pieces so far (completions' text_offset)

    def add(self, out: RequestOutput) -> None:
        self.text += out.new_text
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_output_tokens = len(out.token_ids)
        if out.finished:
            self.finish_reason = out.finish_reason


def sse(obj: dict | str) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n"


async def merged(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, output) from every stream, as they come; raises what a stream raises."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as exc:
            queue.put_nowait((i, exc))
        queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


def close_all(streams: Sequence[RequestStream]) -> None:
    for s in streams:
        s.close()


def _check_error(out: RequestOutput) -> None:
    if out.finished and out.finish_reason == "error":
        raise APIError(500, f"the engine failed this request: {out.error}", "server_error")


async def collect(meta: formats.ResponseMeta, streams: Sequence[RequestStream], piece, want_logprobs: bool) -> dict:
    """Run every choice to its end and build the whole response."""
    choices = [Choice(i) for i in range(len(streams))]
    try:
        async for i, out in merged(streams):
            _check_error(out)
            choices[i].add(out)
    except EngineDied as exc:
        raise APIError(500, str(exc), "server_error") from None
    finally:
        close_all(streams)
    body = []
    for c in choices:
        lps = tuple(c.logprobs) if want_logprobs else None
        if meta.kind == formats.Endpoint.CHAT:
            body.append(formats.chat_choice(c.index, c.text, c.finish_reason, formats.chat_logprobs(lps, piece)))
        else:
            body.append(formats.completion_choice(c.index, c.text, c.finish_reason,
                                                  formats.completion_logprobs(lps, piece, 0)))
    return formats.response(meta, body, _usage(choices))


async def stream_sse(meta: formats.ResponseMeta, streams: Sequence[RequestStream], piece,
                     include_usage: bool, want_logprobs: bool) -> AsyncIterator[str]:
    """SSE events: one chunk per delta that carries text (or logprobs, or the finish), then the usage
    chunk when asked for, then [DONE]. An engine error becomes an error event before [DONE]."""
    choices = [Choice(i) for i in range(len(streams))]
    try:
        if meta.kind == formats.Endpoint.CHAT:  # the role comes first, as OpenAI sends it
            for c in choices:
                yield sse(formats.chat_chunk(meta, c.index, {"role": "assistant", "content": ""}, None, None))
        async for i, out in merged(streams):
            _check_error(out)
            c = choices[i]
            c.add(out)
            if not (out.new_text or out.finished or (want_logprobs and out.logprobs)):
                continue  # a token whose text is held back: nothing to say yet
            yield sse(_chunk(meta, c, out, piece))
        if include_usage:
            yield sse(formats.usage_chunk(meta, _usage(choices)))
    except APIError as exc:
        yield sse(exc.body())
    except EngineDied as exc:
        yield sse(APIError(500, str(exc), "server_error").body())
    finally:
        close_all(streams)
    yield sse("[DONE]")


def _chunk(meta: formats.ResponseMeta, c: Choice, out: RequestOutput, piece) -> dict:
    reason = formats.finish_reason(out)
    if meta.kind == formats.Endpoint.CHAT:
        delta = {"content": out.new_text} if out.new_text else {}
        return formats.chat_chunk(meta, c.index, delta, reason, formats.chat_logprobs(out.logprobs, piece))
    lp = formats.completion_logprobs(out.logprobs, piece, c.offset)
    if lp is not None:
        c.offset = lp["text_offset"][-1] + len(lp["tokens"][-1]) if lp["tokens"] else c.offset
    return formats.completion_chunk(meta, c.index, out.new_text, reason, lp)


def _usage(choices: Sequence[Choice]) -> dict:
    return formats.usage(sum(c.num_prompt_tokens for c in choices), sum(c.num_output_tokens for c in choices))
