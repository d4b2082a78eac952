"""create_app(async_engine): the OpenAI-compatible routes, /metrics and /health over one AsyncEngine.

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (the model's chat template),
GET /metrics (Prometheus text), GET /health, GET /openapi.json (the schema, for clients and fuzzers).
With `api_key`, every /v1 route wants `Authorization: Bearer <api_key>` (401 otherwise); /metrics
stays open as in vLLM unless `metrics_require_key`; /health and /openapi.json stay open. Prompts are
tokenized (and chat templates rendered) in a worker thread: the event loop never does the heavy work.

One base model: a request's `model` field that names a LoRA adapter the engine holds (`inferlab serve
--lora NAME=PATH`) runs with it, and is echoed back; the served name (or no `model`) runs the base model;
any other name is a 404 (model_not_found). /v1/models lists the base model and each adapter (`parent`: the
base). Idle connections are closed after a header timeout (app/server/header_timeout.py).
"""
from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from app.server import formats
from app.server.errors import APIError, bad_request, install_handlers, rejected
from app.server.limits import MAX_BODY_BYTES, BodyLimitMiddleware, public_model_name
from app.server.lora_routes import install_lora_routes
from app.server.protocol import ChatCompletionRequest, CompletionRequest
from app.server.streams import close_all, collect, stream_sse
from engine.core.admission import RequestRejected
from engine.serving.async_engine import AsyncEngine, RequestStream
from engine.serving.loop import EngineUnavailable
from engine.serving.prometheus import ServingMetrics

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(slots=True)
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServingMetrics
    created: int
    plain_special_tokens: bool = False  # special-token text in chat content encoded as text (--plain-special-tokens)

    def adapter(self, model: str | None) -> str | None:
        """The LoRA adapter a request's `model` field names, or None (the base model). A name that is
        neither (a typo, an adapter just unloaded) is a 404, as vLLM and OpenAI answer: serving it with
        the base model would pass one model's answer off as another's."""
        engine = self.engine.engine  # None while the app loads its engine (submit then answers 503)
        if not model or model == self.model_name or engine is None:
            return None
        if any(a.name == model for a in engine.list_loras()):
            return model
        raise APIError(404, f"the model {model[:100]!r} does not exist; GET /v1/models lists the models served",
                       "not_found_error", param="model", code="model_not_found")

    def submit(self, prompts: list, params, meta: formats.ResponseMeta, priority: int,
               param: str, lora_name: str | None = None) -> list[RequestStream]:
        """Queue one engine request per choice; all or none (a refusal closes those already queued)."""
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(self.engine.add_request(prompt, params, request_id=f"{meta.id}-{i}",
                                                       priority=priority, lora_name=lora_name))
        except RequestRejected as exc:
            close_all(streams)
            raise rejected(exc) from None
        except ValueError as exc:
            close_all(streams)
            raise bad_request(exc, param) from None
        except EngineUnavailable as exc:  # loading, or the app is rebuilding its engine
            close_all(streams)
            raise APIError(503, str(exc), "server_error", code="engine_unavailable",
                           headers={"Retry-After": "1"}) from None
        except BaseException:  # anything else: none of this request's prompts is left running
            close_all(streams)
            raise
        return streams

    def check_fits_queue(self, num_prompts: int) -> None:
        """More prompts than the queue can ever hold at once: a 400 (a 429 would invite retrying forever)."""
        engine = self.engine.engine  # None while the app loads its engine (submit then answers 503)
        limit = engine.config.max_queue_len if engine is not None else None
        if limit is not None and num_prompts > limit:
            raise APIError(400, f"{num_prompts} prompts can never be queued at once: the queue holds at most "
                                f"max_queue_len={limit} requests; send fewer per request", param="prompt",
                           code="too_many_prompts")


def create_app(async_engine: AsyncEngine, *, model_name: str | None = None, api_key: str | None = None,
               metrics: ServingMetrics | None = None, metrics_require_key: bool = False,
               max_body_bytes: int = MAX_BODY_BYTES, lora_dir: str | None = None,
               plain_special_tokens: bool = False) -> FastAPI:
    """The ASGI app. `metrics`: a ServingMetrics already listening to the engine (when omitted, one
    subscribes to the AsyncEngine's loop, so it follows a rebuilt engine). The caller owns the
    AsyncEngine's lifecycle (start/shutdown). `lora_dir`: turns on loading LoRA adapters over HTTP, from
    folders inside it only (app/server/lora_routes.py). `plain_special_tokens`: special-token text inside
    chat messages' content is encoded as plain text, not as control tokens (Tokenizer.encode_chat)."""
    name = public_model_name(model_name or str(async_engine.engine.config.model))  # never a local path
    metrics = metrics or async_engine.loop.subscribe(ServingMetrics(async_engine.engine, name))
    state = ServerState(async_engine, name, metrics, int(time.time()), plain_special_tokens)
    app = FastAPI(title="inferlab", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.inferlab = state
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if api_key and metrics_require_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key, paths=("/metrics",))
    install_handlers(app)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if lora_dir is not None:
        install_lora_routes(app, lambda: async_engine.engine, lora_dir, name)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "inferlab",
                "max_model_len": async_engine.max_model_len}
        adapters = [{**card, "id": a.name, "parent": state.model_name, "root": a.name}
                    for a in async_engine.engine.list_loras()]
        return {"object": "list", "data": [card, *adapters]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        body.refuse_unsupported()
        lora = state.adapter(body.model)
        prompts, params = body.prompts(), body.sampling_params()
        state.check_fits_queue(len(prompts))
        ids = await asyncio.to_thread(_encode_prompts, async_engine.tokenizer, prompts)
        meta = formats.ResponseMeta(formats.Endpoint.COMPLETION, lora or state.model_name)
        streams = state.submit(ids, params, meta, body.priority, "prompt", lora)
        return await _respond(request, meta, streams, body.stream, body.include_usage, body.logprobs is not None)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        body.refuse_unsupported()
        lora = state.adapter(body.model)
        tok = async_engine.tokenizer
        if not tok.has_chat_template:
            raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
        ids = await asyncio.to_thread(_render_chat, tok, body.chat_messages(), state.plain_special_tokens)
        params = body.sampling_params(len(ids), async_engine.max_model_len)
        meta = formats.ResponseMeta(formats.Endpoint.CHAT, lora or state.model_name)
        streams = state.submit([ids], params, meta, body.priority, "messages", lora)
        return await _respond(request, meta, streams, body.stream, body.include_usage, body.logprobs)

    async def _respond(request: Request, meta: formats.ResponseMeta, streams, stream: bool, include_usage: bool,
                       want_logprobs: bool):
        piece = async_engine.tokenizer.id_to_piece
        if stream:
            events = stream_sse(meta, streams, piece, include_usage, want_logprobs)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        return await _unless_disconnected(request, collect(meta, streams, piece, want_logprobs), streams)

    return app


def _encode_prompts(tok, prompts: list) -> list[list[int]]:
    """Token ids of every prompt, encoded as the engine's intake encodes them (a worker thread: a huge
    prompt must not stall the event loop, /health and every other stream)."""
    return [(tok.encode(p) if p else []) if isinstance(p, str) else p for p in prompts]


def _render_chat(tok, messages: list[dict[str, str]], plain_special_tokens: bool = False) -> list[int]:
    """The chat template's token ids (a worker thread: heavy for a long conversation); the template writes
    its own special tokens, and with `plain_special_tokens` those inside the contents stay text."""
    try:
        return tok.encode_chat(messages, plain_special_text=plain_special_tokens)
    except Exception as exc:  # the template itself may raise (e.g. roles it does not allow)
        raise bad_request(f"the chat template failed: {exc}", "messages") from None


async def _unless_disconnected(request: Request, work, streams: list[RequestStream]):
    """Run `work`; if the client disconnects first, cancel it (its streams close, their requests abort)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        close_all(streams)
        return Response(status_code=499)  # nobody will read it
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class APIKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which would sit between a stream and its disconnect)."""

    def __init__(self, app, api_key: str, paths: tuple[str, ...] = ("/v1",)) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.paths = paths  # path prefixes that want the key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.paths):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):  # constant time: no timing oracle on the key
                body = APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                                code="invalid_api_key").body()
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
