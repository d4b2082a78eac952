"""`inferlab serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one AsyncEngine.

    from app.server import create_app, ServerThread
    server = ServerThread(create_app(async_engine, model_name="smollm2-135m"), "127.0.0.1", 8000).start()
    ...
    server.stop()

The HTTP stack is imported when these names are first used, not with the package: the other commands
(`inferlab bench ...` on a GPU machine without FastAPI, say) build their argument parser from
app.server.serve without it.
"""
from __future__ import annotations

__all__ = ["ServerThread", "create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from app.server.api import create_app

        return create_app
    if name == "ServerThread":
        from app.server.thread import ServerThread

        return ServerThread
    raise AttributeError(f"module 'app.server' has no attribute {name!r}")
