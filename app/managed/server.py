"""A managed server: one engine's real server process at one configuration point, restartable.

Built on the benches' ChildServer (child process on a free loopback port, log to a temporary file,
/health polled until it answers 200). A point that cannot start (a flag the engine refuses, out of
memory, a crash) raises `PointFailed` with the server's last log lines, so a sweep records it and
goes on; nothing is left running after a failure.

Threads: start/restart run one at a time (a second restart waits for the first, then runs); stop()
may come from any thread at any time and ends a server that is still starting, so one ManagedServer
never has two processes and none is left behind.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from app.managed.child import LLAMA_CPP_CRASH_RETRY, ChildServer, PeerError, crash_retry_note, free_port
from app.managed.table import FlagError, ServedModel, ServerEngine, ServerPoint


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
    # added to the engine's flags after llama-server crashed at start (LLAMA_CPP_CRASH_RETRY), and why
    extra_args: tuple[str, ...] = ()
    note: str | None = None
    _child: ChildServer | None = field(default=None, repr=False)
    _last_log: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # guards _child
    _sequence: threading.RLock = field(default_factory=threading.RLock, repr=False)  # one start/restart

    # (each reads self._child once: a stop() in another thread may set it to None at any moment)
    @property
    def url(self) -> str:
        child = self._child
        if child is None:
            raise RuntimeError(f"{self.engine.name} is not running")
        return child.url

    @property
    def command(self) -> list[str]:
        child = self._child
        return list(child.command) if child is not None else []

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (its memory is read from /proc/PID)."""
        proc = self._process()
        return proc.pid if proc is not None and proc.poll() is None else None

    def exit_code(self) -> int | None:
        """The server's exit status once it has died on its own (None while it runs or when stopped)."""
        proc = self._process()
        return None if proc is None else proc.poll()

    def alive(self) -> bool:
        proc = self._process()
        return proc is not None and proc.poll() is None

    def _process(self):
        child = self._child
        return child.proc if child is not None else None

    def start(self) -> ManagedServer:
        """Start at `point`; PointFailed (with the log's tail) when it does not come up. On a free port
        that someone else took before the server bound it, it tries once more on another."""
        with self._sequence:
            try:
                return self._start_once()
            except PointFailed as exc:
                crashed = getattr(exc.__cause__, "signal", None)
                tried = (*self.extra_args, *getattr(self.engine, "extra", ()))
                if crashed and self.engine.name == "llama-server" and LLAMA_CPP_CRASH_RETRY[0] not in tried:
                    self.extra_args, self.note = LLAMA_CPP_CRASH_RETRY, crash_retry_note(self.engine.name, crashed)
                elif self.port is not None or not getattr(exc.__cause__, "port_taken", False):
                    raise
            return self._start_once()

    def _start_once(self) -> ManagedServer:
        with self._lock:
            if self._child is not None:
                raise RuntimeError(f"{self.engine.name} is already running")
            port = self.port or free_port()
            try:
                argv = [*self.engine.argv(self.exe, self.model, self.point, port, self.threads), *self.extra_args]
            except FlagError as exc:
                raise PointFailed(f"{self.engine.name} cannot run {self.point.label()}: {exc}") from exc
            child = self._child = ChildServer(self.engine.name, argv, port)  # a stop() now ends it
        try:
            child.start(self.start_timeout_s)
        except PeerError as exc:  # start() already stopped it; the message carries the log's tail
            self._forget(child)
            raise PointFailed(str(exc), str(exc)) from exc
        except (OSError, ValueError) as exc:  # no such executable, not executable; a NUL byte in argv
            self._forget(child)
            raise PointFailed(f"{self.engine.name} could not be started ({argv[0]}): {exc}") from exc
        except BaseException:
            self._forget(child)
            raise
        return self

    def _forget(self, child: ChildServer) -> None:
        with self._lock:
            if self._child is child:
                self._child = None

    def log_tail(self) -> str:
        child = self._child
        return child.log_tail() if child is not None else self._last_log

    def stop(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            self._last_log = child.log_tail() or self._last_log
            child.stop()

    def restart(self, point: ServerPoint) -> None:
        """Stop, then start at `point` (the same engine and model); concurrent restarts run in turn."""
        with self._sequence:
            self.stop()
            self.point = point
            self.start()

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
