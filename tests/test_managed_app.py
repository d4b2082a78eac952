"""Issue 29 point 3: the app on a server inferlab started; its batch / weights / draft sliders restart it
with the new flags, off the GUI thread (the stand-in of tests/managed_standin.py is the server)."""
from __future__ import annotations

import llama_cpp_peer
import pytest
from app_helpers import run_for, wait_until
from managed_helpers import argv_lines, request_count, standin_server
from PySide6.QtCore import QElapsedTimer, QTimer

from app.gui.main_window import MainWindow
from app.managed.knobs import changed_flags, point_with
from app.managed.server import ManagedServer
from app.managed.source import ManagedSource
from app.managed.table import ServerPoint

pytestmark = pytest.mark.timeout(180)


def wait(qapp, predicate) -> None:
    wait_until(qapp, predicate, timeout_s=30.0)  # servers start in child processes: slower than a widget


class Watched:
    """A managed window, what its status said while busy, the event loop's ticks, and the load's state
    at each restart."""

    def __init__(self, qapp, tmp_path, monkeypatch) -> None:
        self.server = standin_server(tmp_path)
        self.source = ManagedSource(self.server, debounce_s=0.4)
        self.window = MainWindow(self.source, None, persist=False)
        self.window.controller.interactive = False
        self.busy: list[str] = []
        self.window.feeder.sigBusy.connect(lambda text, _f: self.busy.append(text))
        self.server_states: list[tuple[str, str]] = []
        self.window.feeder.sigServerStatus.connect(lambda state, text: self.server_states.append((state, text)))
        self.load_at_restart: list[bool] = []
        original = ManagedServer.restart

        def restart(server, point):
            self.load_at_restart.append(self.source.loadgen.running)
            original(server, point)
        monkeypatch.setattr(ManagedServer, "restart", restart)
        self.window.show()
        self.source.start()
        wait(qapp, lambda: self.window.controller.engine_ready)
        run_for(qapp, 0.5)  # the first paint of every dock is done
        self.ticks: list[int] = []  # from here on (the restarts), the event loop must keep turning
        clock = QElapsedTimer()
        clock.start()
        self.timer = QTimer()
        self.timer.setInterval(20)
        self.timer.timeout.connect(lambda: self.ticks.append(clock.elapsed()))
        self.timer.start()

    def move_slider(self, qapp, name: str, values) -> None:
        """The user drags a slider over `values` (each position emits, as a drag does)."""
        slider = self.window.panels.controls.row(name)
        for v in values:
            slider.slider.setValue(slider.values().index(v))
            run_for(qapp, 0.05)

    def max_gap_ms(self) -> int:
        return max(b - a for a, b in zip(self.ticks, self.ticks[1:]))

    def close(self, qapp) -> None:
        self.timer.stop()
        self.window.close()
        run_for(qapp, 0.05)


def test_changed_flags_in_the_engines_words():
    old = ["llama-server", "-m", "/m/a-F16.gguf", "-np", "4", "--port", "9", "--draft-max", "4", "--metrics"]
    new = ["llama-server", "-m", "/m/a-Q4_1.gguf", "-np", "8", "--port", "9", "--metrics"]
    assert changed_flags(old, new) == "-m a-Q4_1.gguf -np 8 without --draft-max"
    assert point_with(ServerPoint(batch=4), {"max_num_seqs": 8, "num_speculative_tokens": 3}, "llama-server") == \
        ServerPoint(batch=8, draft=3)
    with pytest.raises(ValueError, match="does not change by restarting"):
        point_with(ServerPoint(), {"max_num_batched_tokens": 512}, "llama-server")


def test_a_burst_of_slider_moves_is_one_restart_with_the_new_flags(qapp, tmp_path, monkeypatch):
    w = Watched(qapp, tmp_path, monkeypatch)
    try:
        controls = w.window.panels.controls
        assert "max_num_seqs" not in controls.snapshot_data()["unavailable"]
        assert "by restart" in controls.row("max_num_seqs").toolTip()
        assert controls.row("max_num_seqs").value() == 4  # the sliders show the server's own point
        w.window.controller.set_arrival_rate(8.0)
        w.window.controller.set_load_running(True)
        wait(qapp, lambda: request_count(w.server) >= 2)
        w.move_slider(qapp, "max_num_seqs", (5, 6, 7, 8))  # one drag: four positions
        wait(qapp, lambda: w.source.restarts == 1 and w.window.controller.state.server_point
                        .get("max_num_seqs") == 8)
        run_for(qapp, 1.0)  # no second restart follows
        assert w.source.restarts == 1
        starts = argv_lines(w.server)
        assert len(starts) == 2  # the first start and one restart
        assert starts[0][starts[0].index("-np") + 1] == "4" and starts[1][starts[1].index("-np") + 1] == "8"
        assert "restarting stand-in with -np 8…" in w.busy  # the engine's own flag in the status
        assert ("restarting", "restarting stand-in with -np 8…") in w.server_states  # the Server panel's too
        assert w.window.panels.server.snapshot_data()["status"][0] == "no-metrics"  # then what came back
        assert w.load_at_restart == [False]  # the live load was paused while it restarted...
        assert w.source.loadgen.running  # ...and resumed after /health answered
        before = request_count(w.server)
        wait(qapp, lambda: request_count(w.server) > before)  # the new server takes the load
        assert "stand-in restarted:" in w.window.status_label.text() and "-np 8" in w.window.status_label.text()
        assert w.max_gap_ms() < 1000  # the GUI thread never waited for the server
    finally:
        w.close(qapp)
    assert not w.server.alive()  # closing the window stopped the server


def test_a_failed_restart_says_why_and_keeps_the_last_good_point(qapp, tmp_path, monkeypatch):
    w = Watched(qapp, tmp_path, monkeypatch)
    try:
        w.window.controller.set_load_running(True)
        w.move_slider(qapp, "max_num_seqs", (32,))  # over the stand-in's memory: it dies at start
        wait(qapp, lambda: w.source.restarts == 1 and w.window.controller.last_error is not None)
        error = w.window.controller.last_error
        assert "stand-in did not restart at the asked point" in error
        assert "cannot allocate the KV cache for 32 slots (out of memory)" in error  # the server's log tail
        assert "-np 4" in error  # the last good point, as a command line
        starts = argv_lines(w.server)
        assert [s[s.index("-np") + 1] for s in starts] == ["4", "32", "4"]  # asked, failed, back
        assert w.window.panels.controls.row("max_num_seqs").value() == 4  # the slider went back too
        assert w.window.controller.state.config["max_num_seqs"] == 4
        assert w.server.alive() and w.window.isVisible()
        wait(qapp, lambda: w.source.loadgen.running)
        assert w.max_gap_ms() < 1000
    finally:
        w.close(qapp)


def test_manage_option_builds_a_managed_source_and_refuses_a_missing_server():
    from app.cli import build_parser
    from app.managed.args import managed_source

    source = managed_source(build_parser().parse_args(["--manage", "inferlab", "--model", "smollm2-135m",
                                                       "--threads", "1"]))
    assert source.engine_name == "inferlab" and source.setup is not None and source.server.threads == 1
    assert source.url == f"http://127.0.0.1:{source.server.port}"  # fixed: restarts keep the URL
    with pytest.raises(ValueError, match="not an executable file"):
        managed_source(build_parser().parse_args(["--manage", "llama-server", "--server-bin", "/no/such/server"]))
    with pytest.raises(SystemExit):  # argparse names the engines it knows
        build_parser().parse_args(["--manage", "no-such-engine"])


def test_closing_the_window_during_a_restart_leaves_no_server_running(qapp, tmp_path, monkeypatch):
    import httpx

    w = Watched(qapp, tmp_path, monkeypatch)
    url = w.source.url
    w.move_slider(qapp, "max_num_seqs", (8,))
    wait(qapp, lambda: len(w.load_at_restart) == 1)  # the restart is under way
    w.close(qapp)
    assert len(argv_lines(w.server)) == 2 and not w.server.alive()
    with pytest.raises(httpx.ConnectError):  # nothing answers on the managed port any more
        httpx.get(url + "/health", timeout=2.0)


@pytest.mark.llama_cpp
def test_a_real_llama_server_restarts_with_its_own_flags(qapp, tmp_path):
    """`inferlab --manage llama-server`: the batch slider restarts the real server with -np/-c."""
    from app.cli import build_parser
    from app.managed.args import managed_source
    llama_cpp_peer.tool("llama-server")
    bf16 = llama_cpp_peer.bf16_gguf()
    (tmp_path / bf16.name).symlink_to(bf16)
    source = managed_source(build_parser().parse_args(["--manage", "llama-server", "--gguf-dir", str(tmp_path),
                                                       "--threads", "1"]))
    window = MainWindow(source, None, persist=False)
    window.controller.interactive = False
    busy: list[str] = []
    window.feeder.sigBusy.connect(lambda text, _f: busy.append(text))
    window.show()
    source.start()
    try:
        wait_until(qapp, lambda: window.controller.engine_ready, 240.0)
        assert source.server.command[source.server.command.index("-np") + 1] == "8"  # ServerPoint's default
        row = window.panels.controls.row("max_num_seqs")
        row.slider.setValue(row.values().index(2))
        wait_until(qapp, lambda: source.restarts == 1 and not window.controller.engine_busy, 240.0)
        assert "restarting llama-server with -np 2 -c 4096…" in busy
        assert window.controller.last_error is None and source.server.alive()
        assert "llama-server restarted:" in window.status_label.text() and " -np 2 " in window.status_label.text()
        window.controller.burst(2)  # the restarted server answers the app's requests
        wait_until(qapp, lambda: window.panels.latency.snapshot_data()["num_finished"] >= 2, 240.0)
    finally:
        window.close()
        run_for(qapp, 0.05)
    assert not source.server.alive()
