"""A managed server: one engine's real server process at one configuration point, restartable.

Built on the benches' ChildServer (child process on a free loopback port, log to a temporary file,
/health polled until it answers 200). A point that cannot start (a flag the engine refuses, out of
memory, a crash) raises `PointFailed` with the server's last log lines, so a sweep records it and
goes on; nothing is left running after a failure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from app.tradeoff.managed.child import ChildServer, PeerError, free_port
from app.tradeoff.managed.table import FlagError, ServedModel, ServerEngine, ServerPoint


class PointFailed(RuntimeError):
    """This point's server would not start or died; `log_tail` holds its last log lines."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(slots=True)
class ManagedServer:
    """`engine`'s server serving `model` at `point`; `start()` waits for health, `restart(point)` swaps
    the flags, `stop()` ends it. The command line run is in `command` (what the user can copy)."""
    engine: ServerEngine
    exe: str
    model: ServedModel
    point: ServerPoint
    threads: int | None = None
    start_timeout_s: float = 300.0
    port: int | None = None  # None: a free port at each start; fixed: restarts keep the URL (the app's)
    _child: ChildServer | None = field(default=None, repr=False)
    _last_log: str = ""

    @property
    def url(self) -> str:
        if self._child is None:
            raise RuntimeError(f"{self.engine.name} is not running")
        return self._child.url

    @property
    def command(self) -> list[str]:
        return list(self._child.command) if self._child is not None else []

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (its memory is read from /proc/PID)."""
        return self._child.proc.pid if self.alive() else None

    def exit_code(self) -> int | None:
        """The server's exit status once it has died on its own (None while it runs or when stopped)."""
        proc = self._child.proc if self._child is not None else None
        return None if proc is None else proc.poll()

    def alive(self) -> bool:
        return self._child is not None and self._child.proc is not None and self._child.proc.poll() is None

    def start(self) -> ManagedServer:
        if self._child is not None:
            raise RuntimeError(f"{self.engine.name} is already running")
        port = self.port or free_port()
        try:
            argv = self.engine.argv(self.exe, self.model, self.point, port, self.threads)
        except FlagError as exc:
            raise PointFailed(f"{self.engine.name} cannot run {self.point.label()}: {exc}") from exc
        child = ChildServer(self.engine.name, argv, port)
        try:
            child.start(self.start_timeout_s)
        except PeerError as exc:  # start() already stopped it; the message carries the log's tail
            raise PointFailed(str(exc), str(exc)) from exc
        except OSError as exc:  # no such executable, not executable
            raise PointFailed(f"{self.engine.name} could not be started ({argv[0]}): {exc}") from exc
        self._child = child
        return self

    def log_tail(self) -> str:
        return self._child.log_tail() if self._child is not None else self._last_log

    def stop(self) -> None:
        if self._child is not None:
            self._last_log = self._child.log_tail()
            self._child.stop()
            self._child = None

    def restart(self, point: ServerPoint) -> None:
        """Stop, then start at `point` (the same engine and model)."""
        self.stop()
        self.point = point
        self.start()

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
