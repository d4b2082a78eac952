"""The JSON the OpenAI API returns: completions, chat completions, their stream chunks, usage, logprobs.

Pure functions of RequestOutputs, so the handlers stay short and the shapes are in one place.
"""
from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field

from engine.events import RequestOutput, StrEnum, TokenLogprob


class Endpoint(StrEnum):
    """Which OpenAI route a response answers: its ids, object names and choice shapes follow."""

    COMPLETION = "completion"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions


@dataclass(slots=True)
class ResponseMeta:
    """What every object of one response shares."""

    kind: Endpoint
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == Endpoint.CHAT else "cmpl-") + uuid.uuid4().hex

    def envelope(self, chunk: bool) -> dict:
        if self.kind == Endpoint.CHAT:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(out: RequestOutput) -> str | None:
    """OpenAI knows "stop" and "length"; an aborted request reports "abort" (the client is gone anyway)."""
    return out.finish_reason if out.finished else None


_BYTE_PIECE = re.compile(r"(?:<0x[0-9A-Fa-f]{2}>)+")


def token_bytes(piece: str) -> bytes:
    """A token's raw bytes. A token that holds part of a UTF-8 character is shown as "<0xE4><0xBD>"
    (tokenizer.id_to_piece); its bytes are those, not the characters of that spelling."""
    if _BYTE_PIECE.fullmatch(piece):
        return bytes(int(piece[i + 3: i + 5], 16) for i in range(0, len(piece), 6))
    return piece.encode("utf-8")


# --- logprobs ------------------------------------------------------------------------------------------
def completion_logprobs(lps: tuple[TokenLogprob, ...] | None, piece, offset: int) -> dict | None:
    """The legacy completions shape: parallel lists, top alternatives as {token: logprob}."""
    if lps is None:
        return None
    tokens, offsets = [], []
    for lp in lps:
        tokens.append(piece(lp.token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{text: v for _i, v, text in lp.top} for lp in lps], "text_offset": offsets}


def chat_logprobs(lps: tuple[TokenLogprob, ...] | None, piece) -> dict | None:
    if lps is None:
        return None

    def entry(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(token_bytes(text))}

    return {"content": [{**entry(piece(lp.token_id), lp.logprob),
                         "top_logprobs": [entry(text, v) for _i, v, text in lp.top]} for lp in lps],
            "refusal": None}


# --- whole responses -----------------------------------------------------------------------------------
def completion_choice(index: int, text: str, reason: str | None, logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def chat_choice(index: int, text: str, reason: str | None, logprobs: dict | None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": logprobs, "finish_reason": reason}


def response(meta: ResponseMeta, choices: list[dict], usage_: dict) -> dict:
    return {**meta.envelope(chunk=False), "choices": choices, "usage": usage_}


# --- stream chunks -------------------------------------------------------------------------------------
def completion_chunk(meta: ResponseMeta, index: int, text: str, reason: str | None, logprobs: dict | None) -> dict:
    return {**meta.envelope(chunk=True), "choices": [completion_choice(index, text, reason, logprobs)]}


def chat_chunk(meta: ResponseMeta, index: int, delta: dict, reason: str | None, logprobs: dict | None) -> dict:
    return {**meta.envelope(chunk=True),
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}


def usage_chunk(meta: ResponseMeta, usage_: dict) -> dict:
    """The last chunk when stream_options.include_usage: no choices, the whole request's usage."""
    return {**meta.envelope(chunk=True), "choices": [], "usage": usage_}
