"""ServerThread: uvicorn serving an app from a background thread (the desktop app, the tests).

The socket is bound in the caller's thread, so the port is known (and a bind error is raised) before
start() returns; port 0 picks a free one. The thread runs its own asyncio loop, independent of any
loop (qasync) the caller has.
"""
from __future__ import annotations

import socket
import threading

import uvicorn

from app.server.header_timeout import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS, serving_options


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.app = app
        self.host = host
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=2,
                                **serving_options(header_timeout_s, body_timeout_s, max_connections))
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="inferlab-http", daemon=True)
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread.start()
        for _ in range(int(timeout / 0.01)):
            if self.server.started or not self._thread.is_alive():
                break
            self._thread.join(0.01)
        if not self.server.started:
            raise RuntimeError(f"the HTTP server did not start: {self.error!r}")
        return self

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as exc:  # reported by start()
            self.error = exc

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
