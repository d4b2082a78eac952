"""Hostile servers against the managed-server layer (app/managed/child.py, server.py): a log of
tens of MiB, a server that ignores SIGTERM and forks a child keeping the port, someone else's server on
our port answering /health, two restarts of one ManagedServer at once, a stop while it starts."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from fake_openai_server import make_handler

from app.managed.child import ChildServer, free_port
from app.managed.server import ManagedServer, PointFailed
from app.managed.table import FlagRow, ServedModel, ServerPoint

HOSTILE = Path(__file__).parent / "hostile_managed_server.py"
MODEL = ServedModel({"bf16": "/models/m-bf16.gguf", "q8_0": "/models/m-q8_0.gguf"}, name="m")


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether `pid` ends (or is a zombie) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@dataclass(frozen=True)
class HostileEngine:
    """A flag table whose program is tests/hostile_managed_server.py; `modes_by_batch` picks the server's
    hostile modes per point (its batch), `record` gets each start's pid."""
    modes_by_batch: dict
    record: str = ""
    name: str = "hostile"
    executable: str = sys.executable
    source: str = "tests/hostile_managed_server.py"
    rows: tuple = (FlagRow("batch", "-np", "slots"),)
    health_path: str = "/health"

    def argv(self, exe, model, point, port, threads=None) -> list[str]:
        modes = [arg for mode in self.modes_by_batch.get(point.batch, ()) for arg in ("--mode", mode)]
        record = ["--record", self.record] if self.record else []
        return [exe, str(HOSTILE), "--port", str(port), *modes, *record, "-np", str(point.batch),
                "-m", model.weights(point.weight_format)]


def child(tmp_path: Path, *modes: str, port: int | None = None) -> ChildServer:
    port = port or free_port()
    argv = [sys.executable, str(HOSTILE), "--port", str(port), "--pid-file", str(tmp_path / "child.pid")]
    return ChildServer("hostile", argv + [a for m in modes for a in ("--mode", m)], port, stop_grace_s=1.0)


def test_the_log_tail_of_a_huge_log_is_read_from_its_end(tmp_path):
    server = child(tmp_path, "log:24").start(60)
    try:
        tracemalloc.start()
        tail = server.log_tail()
        _now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        server.stop()
    assert tail.endswith("THE LAST LINE")
    assert len(tail) <= 600
    assert peak < 2**20, f"log_tail allocated {peak / 2**20:.1f} MiB for a 24 MiB log"


def test_stop_ends_a_server_that_ignores_sigterm_and_the_child_that_keeps_its_port(tmp_path):
    server = child(tmp_path, "ignore-term", "fork-child").start(60)
    pid = server.proc.pid
    deadline = time.monotonic() + 10
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int((tmp_path / "child.pid").read_text())
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 5.0  # the grace (1 s here) and a SIGKILL, not a hang
    assert gone(pid) and gone(grandchild), "a process of the stopped server is still running"


def _orphan(tmp_path: Path) -> int:
    deadline = time.monotonic() + 10
    while not (tmp_path / "child.pid").exists() or not (tmp_path / "child.pid").read_text():
        assert time.monotonic() < deadline, "the server's child never wrote its pid"
        time.sleep(0.05)
    return int((tmp_path / "child.pid").read_text())


@pytest.mark.parametrize("mode", ["setsid-child", "daemon-child"])
def test_stop_ends_a_child_that_left_the_servers_group_or_tree(tmp_path, mode):
    """A child that called setsid() (or a daemon, forked twice and reparented to init) outlived stop()."""
    server = child(tmp_path, mode).start(60)
    orphan = _orphan(tmp_path)
    try:
        assert os.getpgid(orphan) != os.getpgid(server.proc.pid)  # (it left the group)
        server.stop()
        assert gone(server.proc.pid) and gone(orphan), f"{mode}: the server's child {orphan} outlived stop()"
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(orphan).kill()


def test_at_exit_a_daemon_the_server_left_is_killed_too(tmp_path):
    exit_without_stop(tmp_path, "daemon-child")
    orphan = _orphan(tmp_path)
    try:
        assert gone(orphan)
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(orphan).kill()


def test_someone_elses_server_on_our_port_is_not_taken_for_ours(tmp_path):
    port = free_port()
    impostor = ThreadingHTTPServer(("127.0.0.1", port), make_handler(str(tmp_path / "impostor.jsonl")))
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    engine = HostileEngine({})
    server = ManagedServer(engine, sys.executable, MODEL, ServerPoint(batch=2), start_timeout_s=20.0, port=port)
    try:
        with pytest.raises(PointFailed) as failed:
            server.start()
        assert "in use" in failed.value.log_tail or "another process" in str(failed.value)
        assert not server.alive()
    finally:
        server.stop()
        impostor.shutdown()
        impostor.server_close()


def test_a_free_port_taken_before_the_server_binds_it_is_retried_once_on_another(tmp_path, monkeypatch):
    from app.managed import server as server_module

    taken = free_port()
    impostor = ThreadingHTTPServer(("127.0.0.1", taken), make_handler(str(tmp_path / "impostor.jsonl")))
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    ports = iter([taken, free_port()])
    monkeypatch.setattr(server_module, "free_port", lambda: next(ports))
    record = tmp_path / "pids.txt"
    server = ManagedServer(HostileEngine({}, record=str(record)), sys.executable, MODEL, ServerPoint(batch=2),
                           start_timeout_s=20.0)
    try:
        server.start()
        assert server.alive() and not server.url.endswith(f":{taken}")
        assert len(pids(record)) == 2 and gone(pids(record)[0])  # the first one could not bind, and is gone
    finally:
        server.stop()
        impostor.shutdown()
        impostor.server_close()


def pids(record: Path) -> list[int]:
    return [int(x) for x in record.read_text().split()] if record.exists() else []


def test_two_restarts_at_once_leave_exactly_one_server_running(tmp_path):
    record = tmp_path / "pids.txt"
    engine = HostileEngine({}, record=str(record))
    server = ManagedServer(engine, sys.executable, MODEL, ServerPoint(batch=1), start_timeout_s=30.0)
    server.start()
    barrier, errors = threading.Barrier(2), []

    def restart(batch: int) -> None:
        barrier.wait()
        try:
            server.restart(ServerPoint(batch=batch))
        except Exception as exc:  # noqa: BLE001 (the test reports what escaped)
            errors.append(exc)

    threads = [threading.Thread(target=restart, args=(b,)) for b in (2, 3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        running = [pid for pid in pids(record) if not gone(pid, 0.5)]
        assert errors == []
        assert running == [server.pid], f"started {pids(record)}, running {running}"
        assert server.point.batch in (2, 3) and f"-np {server.point.batch}" in " ".join(server.command)
    finally:
        server.stop()
    assert all(gone(pid) for pid in pids(record))


def test_a_stop_from_another_thread_ends_a_server_that_is_still_starting(tmp_path):
    engine = HostileEngine({4: ("log:1",)}, record=str(tmp_path / "pids.txt"))
    server = ManagedServer(engine, sys.executable, MODEL, ServerPoint(batch=4), start_timeout_s=30.0)
    failures = []

    def start() -> None:
        try:
            server.start()
        except PointFailed as exc:
            failures.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    while server.pid is None and starter.is_alive():  # the process exists, /health not yet answered
        time.sleep(0.005)
    server.stop()
    starter.join(30)
    assert not starter.is_alive()
    assert all(gone(pid) for pid in pids(tmp_path / "pids.txt"))
    assert not server.alive() and server.pid is None
    assert len(failures) == 1 and "stopped" in str(failures[0])  # it cannot come up after the stop


def exit_without_stop(tmp_path: Path, *modes: str) -> None:
    """A Python that starts the hostile server with `modes` and exits without stopping it."""
    argv = [sys.executable, str(HOSTILE), "--pid-file", str(tmp_path / "child.pid"),
            *(a for m in modes for a in ("--mode", m))]
    script = (f"import sys; sys.path[:0] = [{str(Path(__file__).parents[1])!r}]\n"
              "from app.managed.child import ChildServer, free_port\n"
              "port = free_port()\n"
              f"ChildServer('hostile', {argv!r} + ['--port', str(port)], port).start(60)\n")
    import subprocess

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_servers_still_running_when_the_interpreter_exits_are_killed_with_their_group(tmp_path):
    """As when a window closes while a sweep's thread still waits on a server that ignores SIGTERM."""
    exit_without_stop(tmp_path, "ignore-term", "fork-child")
    deadline = time.monotonic() + 10
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(int((tmp_path / "child.pid").read_text()))


def test_a_health_answer_that_never_ends_does_not_hold_the_start(tmp_path):
    server = child(tmp_path, "health-endless")
    t0 = time.monotonic()
    try:
        server.start(20)
        assert time.monotonic() - t0 < 10.0  # the status is enough: its body is not read
    finally:
        server.stop()


def test_a_restart_on_a_fixed_port_is_not_blocked_by_a_child_the_old_server_left_on_it(tmp_path):
    """The app's managed server keeps its port across restarts: the old server's forked worker that keeps
    the listening socket must go with it."""
    record = tmp_path / "pids.txt"
    engine = HostileEngine({1: ("fork-child", "ignore-term"), 2: ()}, record=str(record))
    server = ManagedServer(engine, sys.executable, MODEL, ServerPoint(batch=1), start_timeout_s=20.0,
                           port=free_port())
    try:
        server.start()
        server._child.stop_grace_s = 1.0  # (the default 10 s grace: the test need not wait it out)
        server.restart(ServerPoint(batch=2))
        assert server.alive() and "-np 2" in " ".join(server.command)
    finally:
        server.stop()
    assert all(gone(pid) for pid in pids(record))
