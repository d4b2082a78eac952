"""Servers for the attach tests: a real `inferlab serve` in a process of its own, and a flaky one."""
from __future__ import annotations

import contextlib
import shlex
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from app.bench.llama_server import free_port
from app.bench.serve_peer import inferlab_server

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def wait_http(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def inferlab_serve(model_folder, *extra: str):
    """`inferlab serve` on a tiny model, in a separate process (the serving peer bench's); yields its URL."""
    with inferlab_server(str(model_folder), 1, shlex.join(extra), "float32") as server:
        yield server.url


class FlakyServer:
    """An OpenAI-ish server whose /metrics can be switched: "ok" (a recorded vLLM payload), "garbage"
    (an HTML page), "slow" (answers after `delay_s`); `stop()` and `start()` take it away and bring it back
    on the same port."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.delay_s = 3.0
        self.port = free_port()
        self.payload = (FIXTURES / "vllm-0.10.scrape1.prom").read_text()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FlakyServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/v1/models":
                    return self._send(200, b'{"object":"list","data":[{"id":"flaky","owned_by":"vllm"}]}',
                                      "application/json")
                if self.path != "/metrics":
                    return self._send(404, b"{}", "application/json")
                if owner.mode == "slow":
                    time.sleep(owner.delay_s)
                if owner.mode == "garbage":
                    return self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
                return self._send(200, owner.payload.encode(), "text/plain; version=0.0.4")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
