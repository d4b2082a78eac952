"""Limits on what one HTTP request may ask, checked before any work: the body's size (counted as it
arrives, whatever Content-Length says), text that is not valid Unicode, and the public model name.

Each refusal is an OpenAI-style 400 that names the limit, so a client knows what to change; none of
them is a 429, which would invite retrying a request that can never succeed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse

from app.server.errors import APIError

MAX_BODY_BYTES = 4 * 2**20  # a long prompt is a few hundred kB of JSON; beyond this, refuse before parsing


class BodyLimitMiddleware:
    """Pure ASGI: refuse a body over `max_bytes` with 400 JSON while it streams in (a lying or missing
    Content-Length changes nothing), before FastAPI reads it whole."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        body = APIError(400, f"the request body exceeds {self.max_bytes} bytes", code="body_too_large").body()
        await JSONResponse(body, status_code=400)(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """Where in a parsed JSON value a string holds a lone UTF-16 surrogate (JSON's "\\ud800" escapes
    decode to one; it is not valid Unicode and no tokenizer or UTF-8 encoder takes it), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{path or 'body'} (character {exc.start})"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        where = lone_surrogate_at(item, f"{path}.{key}" if path else str(key))
        if where is not None:
            return where
    return None


def public_model_name(model: str) -> str:
    """The name to show for a model: a local folder or file by its name only (never where it lives on
    this machine); a Hub id or a built-in name as it is."""
    path = Path(model).expanduser()
    if path.exists():
        return path.stem if path.is_file() else path.resolve().name
    return model
