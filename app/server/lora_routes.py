"""Loading LoRA adapters at run time over HTTP (vLLM's routes): off unless `inferlab serve --lora-dir DIR`,
and then only adapter folders inside DIR. A request names a path; the server resolves it (symlinks and
'..' included) and refuses anything outside DIR before reading a byte, so no request can make the
server open any other file.

    POST /v1/load_lora_adapter    {"lora_name": "style", "lora_path": "style"}   (relative to DIR, or absolute in it)
    POST /v1/unload_lora_adapter  {"lora_name": "style"}
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from app.server.errors import APIError, bad_request
from engine.lora.checks import check_name


class LoadLora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str


def allowed_path(lora_dir: Path, requested: str) -> Path:
    """The adapter folder a request names, resolved; APIError 403 when it lies outside lora_dir."""
    root = lora_dir.resolve()
    path = (root / requested).resolve()  # an absolute `requested` replaces root here, and is checked the same
    if path != root and root not in path.parents:
        raise APIError(403, f"lora_path must lie inside the server's --lora-dir; {requested!r} does not",
                       "permission_error", param="lora_path")
    return path


def without_paths(message: str, path: Path, requested: str, lora_dir: Path) -> str:
    """An error message as the client may see it: the server's folders replaced by what the client named."""
    return message.replace(str(path), repr(requested)).replace(str(lora_dir.resolve()), "<lora-dir>")


def install_lora_routes(app: FastAPI, engine_of, lora_dir: str | Path, base_name: str) -> None:
    """`engine_of()`: the LLMEngine now serving (the app may rebuild it); `base_name`: the served model's
    name, which no adapter may take (a request naming it must reach the base model)."""
    lora_dir = Path(lora_dir)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLora) -> dict:
        if body.lora_name == base_name:
            raise APIError(400, f"lora_name {base_name!r} is the base model's name; choose another",
                           param="lora_name")
        try:
            check_name(body.lora_name)
        except ValueError as exc:
            raise bad_request(exc, "lora_name") from None
        path = allowed_path(lora_dir, body.lora_path)
        try:  # reading and checking the adapter is file I/O and tensor work: off the event loop
            info = await asyncio.to_thread(engine_of().add_lora, body.lora_name, str(path))
        except Exception as exc:  # noqa: BLE001 (the client's file, whatever it made the reader raise: a 400)
            reason = str(exc) if isinstance(exc, ValueError) else f"cannot read this adapter ({type(exc).__name__})"
            raise bad_request(without_paths(reason, path, body.lora_path, lora_dir), "lora_path") from None
        return {"object": "lora_adapter", "id": info.name, "rank": info.rank, "targets": list(info.targets)}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLora) -> dict:
        try:
            engine_of().remove_lora(body.lora_name)
        except ValueError as exc:
            raise bad_request(exc, "lora_name") from None
        return {"object": "lora_adapter", "id": body.lora_name, "deleted": True}
