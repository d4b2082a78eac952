"""A server run as a child process on a free loopback port, up once its /health answers 200.

Used by the benches' peers (llama-server, `inferlab serve`) and by the managed servers a tuning sweep
starts. Its log goes to a temporary file; every error carries the log's tail.
"""
from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import httpx

LOG_TAIL_CHARS = 600


class PeerError(RuntimeError):
    """A peer server that would not start, or answered other than asked: the bench's one error line."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class ChildServer:
    """An HTTP server run as a child process: `with ChildServer(name, command, port) as srv:` starts it,
    waits for its /health to answer 200 and stops it at the end. Its log goes to a temporary file; any
    error carries the log's tail."""
    name: str
    command: list[str]
    port: int
    proc: subprocess.Popen | None = None
    _log: object = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300.0) -> ChildServer:
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        try:
            self._wait_healthy(timeout_s)
        except BaseException:  # not up (or interrupted while starting): nothing is left running
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerError(f"{self.name} exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise PeerError(f"{self.name} did not answer /health within {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()[-LOG_TAIL_CHARS:].strip()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ChildServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
