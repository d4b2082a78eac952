"""Start / stop the OpenAI-compatible server on the app's own engine loop, so external traffic (curl, the
openai client, a load tool) shows up in the panels beside the app's own requests.

The server's AsyncEngine and its metrics subscribe to the host's EngineLoop: when a preset rebuilds the
engine, the loop re-attaches them to the new one, so the server keeps serving across rebuilds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.serving.async_engine import AsyncEngine

if TYPE_CHECKING:
    from app.server import ServerThread


class ServerControl:
    def __init__(self, host, host_name: str = "127.0.0.1", port: int = 8000) -> None:
        self.host = host  # EngineHost: its `loop` steps the engine
        self.host_name, self.port = host_name, port
        self._server: ServerThread | None = None
        self._async: AsyncEngine | None = None
        self._metrics = None

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str | None:
        return f"http://{self.host_name}:{self._server.port}/v1" if self._server else None

    def start(self) -> str:
        """Returns the base URL. Raises RuntimeError when the engine is not loaded yet."""
        if self._server is not None:
            return self.url
        info = self.host.info
        if info is None:
            raise RuntimeError("the model is still loading; start the server once it is ready")
        from app.server import ServerThread, create_app  # FastAPI and pydantic: seconds to import, so only now

        self._async = AsyncEngine(loop=self.host.loop).start()
        app = create_app(self._async, model_name=info.model)
        self._metrics = app.state.inferlab.metrics
        try:
            self._server = ServerThread(app, self.host_name, self.port).start()
        except BaseException:
            self._detach()
            raise
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._detach()
        self._server = None

    def _detach(self) -> None:
        if self._async is not None:
            self._async.shutdown()
            self.host.loop.unsubscribe(self._metrics)
        self._async = self._metrics = None
