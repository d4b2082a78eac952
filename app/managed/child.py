"""A server run as a child process on a free loopback port, up once its /health answers 200.

Used by the benches' peers (llama-server, `inferlab serve`) and by the managed servers a tuning sweep
starts. Its log goes to a temporary file; every error carries the log's tail (read from the file's end:
a server may log gigabytes). The server runs in a session of its own, so `stop()` ends its whole process
group (a server that ignores SIGTERM, or forked workers that keep the port) within a bounded time, and
with it every descendant that left the group: a child that called setsid() outlived `tune` and
`--manage` before. Those are found by psutil, in the server's process tree (taken before any signal:
an orphan leaves it) and by a token in the environment every process the server starts inherits (a
daemon reparented to init is in no tree; the way Jenkins finds a build's strays). A
/health 200 counts only when the listening socket is our process's (or its children's): someone else's
server that took the port first is not mistaken for ours.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import httpx
import psutil

LOG_TAIL_CHARS = 600
STOP_GRACE_S = 10.0  # SIGTERM, then this long for a clean exit, then SIGKILL to the whole group


TOKEN_ENV = "INFERLAB_SERVER_TOKEN"  # set for each server; its descendants inherit it
_RUNNING: dict[int, str] = {}  # process group (the server's pid) -> token, of servers started and not stopped


@atexit.register
def _kill_running() -> None:
    """At interpreter exit (a window closed while a sweep's thread still waited on a server that ignores
    SIGTERM, say), every server still running is killed with its group and its descendants: none outlives
    inferlab."""
    for pgid, token in list(_RUNNING.items()):
        family = _family(pgid, token)
        _signal_group(pgid, signal.SIGKILL)
        _signal_each(family, signal.SIGKILL)


class PeerError(RuntimeError):
    """A peer server that would not start, or answered other than asked: the bench's one error line.
    `port_taken`: another process held its port (taken between free_port() and the server's bind);
    `signal`: the signal it died of while starting (a crash), else None."""

    def __init__(self, message: str, port_taken: bool = False, signal: int | None = None) -> None:
        super().__init__(message)
        self.port_taken, self.signal = port_taken, signal


# llama.cpp's fallback for a binary that crashes at start: its repacked weight layouts (the default) made
# llama-server and llama-batched-bench 0.3.36 die of SIGSEGV on a Sapphire Rapids Xeon (Q4_1, Q8_0;
# 2026-12-03), in ggml's AMX product (GCC dropped its tile configuration: llama.cpp issue 20824, which
# scripts/build_llama_cpp.sh now patches); without repacking they run. Tried once, only after a crash (a build
# without the patch, or another crash), and said where it was used.
LLAMA_CPP_CRASH_RETRY = ("--no-repack",)


def crash_retry_note(name: str, signal: int) -> str:
    return (f"{name} died of signal {signal} with weight repacking (its default); "
            f"measured with {' '.join(LLAMA_CPP_CRASH_RETRY)}")


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
    stop_grace_s: float = STOP_GRACE_S
    _log: object = None
    _ended: bool = False
    _stop_asked: bool = False  # stop() from another thread while this one starts it
    _token: str = ""  # in the environment of the server and all it starts (TOKEN_ENV)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300.0) -> ChildServer:
        self._log = tempfile.TemporaryFile()  # binary: the tail is read by seeking from the end
        self._token = secrets.token_hex(8)
        try:
            self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, TOKEN_ENV: self._token})
        except BaseException:  # no such program, a NUL byte in the argv: nothing runs, the log is closed
            self.stop()
            raise
        _RUNNING[self.proc.pid] = self._token
        try:
            if self._stop_asked:
                raise PeerError(f"{self.name} was stopped while it started")
            self._wait_healthy(timeout_s)
        except BaseException:  # not up (or interrupted while starting): nothing is left running
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        impostor = False
        while time.monotonic() < deadline:
            if self._stop_asked:
                raise PeerError(f"{self.name} was stopped while it started")
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                raise PeerError(f"{self.name} exited ({rc}): {self.log_tail()}",
                                port_taken=bool(_listeners(self.port) - {None}), signal=-rc if rc < 0 else None)
            healthy = health_status(self.url + "/health") == 200
            if healthy and self.answer_is_ours():
                return
            impostor = healthy  # someone else's server answers on our port (ours may yet fail to bind)
            time.sleep(0.25)
        who = " (another process listens on the port)" if impostor else ""
        raise PeerError(f"{self.name} did not answer /health within {timeout_s:.0f} s{who}: {self.log_tail()}",
                        port_taken=impostor)

    def answer_is_ours(self) -> bool:
        """False when the listening socket on our port is held by a process we can see that is neither
        ours nor one of its children (someone who took the port first); True when it is ours, or when its
        owner cannot be seen (another user's, e.g. a container's proxy: given the benefit of the doubt)."""
        try:
            root = psutil.Process(self.proc.pid)
            ours = {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.Error:
            return True
        owners = _listeners(self.port)
        return bool(owners & ours) or not (owners - {None})

    def log_tail(self) -> str:
        """The log's last LOG_TAIL_CHARS characters, read from the end of the file (never the whole log)."""
        log = self._log
        if log is None:
            return ""
        try:
            end = log.seek(0, os.SEEK_END)
            log.seek(max(0, end - 4 * LOG_TAIL_CHARS))  # up to 4 bytes per UTF-8 character
            return log.read().decode("utf-8", "replace")[-LOG_TAIL_CHARS:].strip()
        except (ValueError, OSError):  # closed by a stop() in another thread
            return ""

    def stop(self) -> None:
        """SIGTERM to the server's process group and every descendant (_family), SIGKILL to what is left of
        them after `stop_grace_s`. Safe from another thread while start() waits (that start then fails:
        stopped while starting)."""
        self._stop_asked = True
        if self.proc is not None and not self._ended:
            self._ended = True  # the group's id is not signalled again once it may have been reused
            family = _family(self.proc.pid, self._token)  # before any signal: an orphan leaves the tree
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM)
                _signal_each(family, signal.SIGTERM)
                try:
                    self.proc.wait(self.stop_grace_s)
                except subprocess.TimeoutExpired:
                    pass
            family += _family(self.proc.pid, self._token)  # and any started during the grace
            _signal_group(self.proc.pid, signal.SIGKILL)  # children that outlived it (a worker keeping the port)
            _signal_each(family, signal.SIGKILL)
            _RUNNING.pop(self.proc.pid, None)
            if self.proc.poll() is None:
                self.proc.wait(5)
            psutil.wait_procs([p for p in family if p.pid != self.proc.pid], timeout=5)
        log, self._log = self._log, None
        if log is not None:
            log.close()

    def __enter__(self) -> ChildServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


HEALTH_TOTAL_S = 2.0  # one /health answer's status line and headers, however slowly they come


def health_status(url: str) -> int | None:
    """The status of GET `url` within HEALTH_TOTAL_S, its body never read (a /health that trickles or
    never ends cannot hold the start past its timeout); None when there is no answer in time."""
    async def status() -> int:
        async with asyncio.timeout(HEALTH_TOTAL_S), httpx.AsyncClient(timeout=HEALTH_TOTAL_S) as client:
            async with client.stream("GET", url) as resp:
                return resp.status_code

    try:
        return asyncio.run(status())
    except (httpx.HTTPError, TimeoutError):
        return None


def _listeners(port: int) -> set[int | None]:
    """The pids listening on TCP `port` (None for a process this user cannot see); empty when unknown."""
    try:
        return {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    except psutil.Error:
        return set()


def _family(pid: int, token: str) -> list[psutil.Process]:
    """The server `pid`, its descendants, and every process of this user whose environment carries its
    `token` (one that left the tree); the server's own pid first."""
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        found = {p.pid: p for p in (root, *root.children(recursive=True))}
    except psutil.Error:  # gone already: only the token finds what it left
        pass
    if token:
        uid = os.getuid()
        for proc in psutil.process_iter(["uids", "environ"]):
            try:
                if proc.info["uids"] and proc.info["uids"].real == uid and \
                        (proc.info["environ"] or {}).get(TOKEN_ENV) == token:
                    found.setdefault(proc.pid, proc)
            except (psutil.Error, AttributeError):
                continue
    return list(found.values())


def _signal_each(procs: list[psutil.Process], sig: int) -> None:
    """`sig` to each process still running (psutil checks the pid was not reused since it was found)."""
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass
