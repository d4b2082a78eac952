"""Start / stop the OpenAI-compatible server on the app's own engine, so external traffic (curl, the
openai client, a load tool) shows up in the panels beside the app's own requests."""
from __future__ import annotations

from app.server import ServerThread, create_app
from engine.serving.async_engine import AsyncEngine


class ServerControl:
    def __init__(self, host, host_name: str = "127.0.0.1", port: int = 8000) -> None:
        self.host = host  # EngineHost: its add_request / abort queue commands and wake its engine thread
        self.host_name, self.port = host_name, port
        self._server: ServerThread | None = None
        self._async: AsyncEngine | None = None

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
        engine = self.host.engine
        if engine is None:
            raise RuntimeError("the model is still loading; start the server once it is ready")
        self._async = AsyncEngine(engine, driver=self.host)
        model_name = getattr(getattr(self.host, "info", None), "model", None) or engine.config.model
        self._server = ServerThread(create_app(self._async, model_name=model_name), self.host_name,
                                    self.port).start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._async.shutdown()
        self._server = self._async = None
