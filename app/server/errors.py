"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status."""
from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.core.admission import RequestRejected


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(exc: ValueError | str, param: str | None = None) -> APIError:
    """400 for a request the engine or the sampling parameters refused."""
    message = str(exc)
    code = "context_length_exceeded" if "context length" in message else None
    return APIError(400, message, param=param, code=code)


def rejected(exc: RequestRejected) -> APIError:
    """429 with Retry-After (whole seconds, rounded up) when admission control refuses."""
    retry = max(1, math.ceil(exc.retry_after_s))
    return APIError(429, str(exc), "rate_limit_error", code=exc.reason, headers={"Retry-After": str(retry)})


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": ")
                            ).response()
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                            for e in errors)
        return APIError(400, message, param=".".join(loc) or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type_).response()

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # a bug, not the client's fault: still OpenAI-style JSON (uvicorn logs the traceback)
        return APIError(500, f"internal error: {type(exc).__name__}", "server_error").response()
