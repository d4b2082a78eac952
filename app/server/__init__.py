"""`inferlab serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one AsyncEngine.

    from app.server import create_app, ServerThread
    server = ServerThread(create_app(async_engine, model_name="smollm2-135m"), "127.0.0.1", 8000).start()
    ...
    server.stop()
"""
from app.server.api import create_app
from app.server.thread import ServerThread

__all__ = ["ServerThread", "create_app"]
