"""The app attached to a server over HTTP (issue 17): a real `inferlab serve` in a separate process, a
server that goes away / answers slowly / returns garbage, and llama-server where it is built."""
from __future__ import annotations

import subprocess
import time

import httpx
import llama_cpp_peer
import pytest
from app_helpers import run_for
from attach_helpers import FlakyServer, free_port, inferlab_serve, wait_http
from PySide6.QtCore import QElapsedTimer, QTimer

from app.gui.main_window import MainWindow
from app.load.generator import LoadConfig
from app.remote.source import RemoteSource, base_url
from app.source import channel
from app.source.engine_source import EngineSource
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(300)


def wait_for(qapp, predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        run_for(qapp, 0.05)
    return predicate()


class Collector:
    """Drains a source as the window would, keeping every item."""

    def __init__(self, source) -> None:
        self.source, self.items = source, []

    def poll(self) -> list:
        self.items += self.source.drain()
        return self.items

    def finished(self, rid: str):
        return next((i for i in self.poll() if isinstance(i, channel.ClientFinished)
                     and i.timeline.request_id == rid), None)


@pytest.fixture(scope="module")
def served(tiny_llama):
    with inferlab_serve(tiny_llama) as url:
        yield url


def test_base_url():
    assert base_url("localhost:8000/v1/") == "http://localhost:8000"
    assert base_url("https://h.example/proxy/v1") == "https://h.example/proxy"
    with pytest.raises(ValueError):
        base_url("ftp://x")


def test_source_against_inferlab_serve(qapp, served):
    source = RemoteSource(served + "/v1", scrape_hz=8.0)
    assert isinstance(source, EngineSource)
    got = Collector(source)
    source.start()
    try:
        assert wait_for(qapp, lambda: source.info is not None)
        assert source.kind == "inferlab" and source.name == f"inferlab at {served}"
        caps = source.info.capabilities
        assert {"load_generator", "server_metrics", "client_timings"} <= caps.names()
        assert "block_map" not in caps and "step_events" not in caps and not caps.reconfigurable
        rid, _ = source.submit_prompt("Hello there", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                                      chat=False)
        assert wait_for(qapp, lambda: got.finished(rid) is not None)
        done = got.finished(rid)
        tl = done.timeline
        assert tl.finish_reason == "length" and tl.num_output_tokens == 12  # the server's usage
        assert 0 < tl.ttft <= tl.e2e and tl.num_prompt_tokens > 0
        outs = [i for i in got.items if isinstance(i, channel.ClientOutput) and i.output.request_id == rid]
        assert outs[-1].output.finished and "".join(o.output.new_text for o in outs) == outs[-1].output.text
        assert all(a.t <= b.t for a, b in zip(outs, outs[1:]))  # stamped on arrival, in order
        # an abort closes the stream; the server drops the request (its own counter says "abort"). The tiny
        # model can write all 200 tokens before the abort lands on a busy machine (then it ends "length"):
        # up to three tries, and one of them must be an abort
        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        reasons = []
        for _ in range(3):
            rid2, _ = source.submit_prompt("Tell me a story", long, chat=False)
            assert wait_for(qapp, lambda rid2=rid2: any(isinstance(i, channel.ClientOutput)
                                                        and i.output.request_id == rid2 for i in got.poll()))
            source.abort(rid2)
            assert wait_for(qapp, lambda rid2=rid2: got.finished(rid2) is not None)
            reasons.append(got.finished(rid2).timeline.finish_reason)
            assert reasons[-1] in ("abort", "length")
            if reasons[-1] == "abort":
                break
        assert reasons[-1] == "abort", reasons
        assert wait_for(qapp, lambda: 'finished_reason="abort"' in httpx.get(served + "/metrics").text)
        # the load generator sends streaming requests; the scrapes see the tokens they made
        source.set_load_config(LoadConfig(arrival_rate=6.0, prompt_tokens=(8, 24), output_tokens=(4, 8)))
        source.start_load()
        assert wait_for(qapp, lambda: sum(isinstance(i, channel.ClientFinished)
                                          and i.timeline.request_id.startswith("load-") for i in got.poll()) >= 4)
        source.stop_load()
        assert any(isinstance(i, channel.LoadStream) for i in got.items)
        assert wait_for(qapp, lambda: (source.facts is not None and source.facts.latency.get("ttft") is not None
                                       and source.facts.latency["ttft"].count >= 1))
        samples = [i.facts for i in got.poll() if isinstance(i, channel.ServerSample)]
        assert any((f.generation_tokens_per_s or 0) > 0 for f in samples)
        blocks, block_size = source.facts.kv_blocks  # inferlab:cache_config_info
        assert source.facts.not_exposed == () and blocks > 0 and block_size == EngineConfig().block_size
        assert source.status[0] == "connected"
    finally:
        assert source.shutdown(10.0)


def test_window_attached_to_inferlab_serve(qapp, served):
    source = RemoteSource(served)
    window = MainWindow(source, None, persist=False)
    window.controller.interactive = False
    window.show()
    source.start()
    try:
        assert window.controller.apply_preset("traffic-jam")
        assert wait_for(qapp, lambda: window.controller.engine_ready)
        p = window.panels
        assert wait_for(qapp, lambda: p.latency.snapshot_data()["num_finished"] >= 3, timeout=40)
        window.flush_panels()
        where = f"not exposed by inferlab at {served}"
        for name in ("memory", "quant", "roofline", "tradeoff", "comparison"):
            assert where in p.named(name).overlay_text(), name
        assert "block map" in p.memory.overlay_text()
        assert p.timeline.is_available() and where in p.timeline.steps_note()
        assert p.timeline.snapshot_data()["gantt"]["rows"]  # client-timed rows
        # the panels were reset when the preset applied; the next scrape (4 Hz, slower while the server is
        # busy) refills the Server panel
        assert wait_for(qapp, lambda: p.server.snapshot_data()["facts"] is not None)
        assert p.server.is_available()
        assert wait_for(qapp, lambda: p.latency.snapshot_data()["total_tokens_per_s"])
        # the summary line is painted at the panels' frame rate, after the scrape that set the server's rate
        assert wait_for(qapp, lambda: "/metrics" in p.latency.snapshot_data()["summary"])
        lat = p.latency.snapshot_data()
        assert lat["percentiles"]["ttft"] is not None
        # issue 27: the tokens/s shown is the server's generated tokens/s (/metrics), not a client-side sum
        assert lat["tokens_per_s_from"] == "server" and "/metrics" in lat["summary"]
        facts = p.server.snapshot_data()["facts"]
        assert lat["total_tokens_per_s"] == pytest.approx(facts["generation_tokens_per_s"])
        assert p.tokens.snapshot_data()  # streams opened for the load generator's requests
        unavailable = p.controls.snapshot_data()["unavailable"]
        assert "max_num_seqs" in unavailable and "arrival_rate" not in unavailable
        assert "Attached" in window.caption.snapshot_data()["caption"]  # the preset works on a server
        window.controller.apply_knobs({"enable_chunked_prefill": True})  # a cue: the server keeps its setting
        assert "not changeable from a client" in window.status_label.text()
        assert "inferlab at" in window.engine_label.text()
    finally:
        window.close()
        run_for(qapp, 0.05)


def test_flaky_server_gets_a_clear_status_and_the_gui_never_freezes(qapp):
    server = FlakyServer().start()
    source = RemoteSource(server.url, scrape_hz=10.0, timeout_s=2.0)
    window = MainWindow(source, None, persist=False)
    window.controller.interactive = False
    ticks: list[int] = []
    clock = QElapsedTimer()
    clock.start()
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: ticks.append(clock.elapsed()))
    timer.start()
    window.show()
    source.start()
    status = lambda: window.panels.server.snapshot_data()["status"]  # noqa: E731
    try:
        assert wait_for(qapp, lambda: status()[0] == "connected")
        assert source.kind == "vllm" and window.panels.server.snapshot_data()["facts"]["kv_blocks"] == (27264, 16)
        server.mode = "garbage"
        assert wait_for(qapp, lambda: status()[0] == "garbage")
        assert "something else than metrics" in window.status_label.text()
        server.mode = "ok"
        assert wait_for(qapp, lambda: status()[0] == "connected")
        assert status()[1].startswith("reconnected")
        server.mode, server.delay_s = "slow", 1.1  # under the 2 s timeout, over "slow"
        assert wait_for(qapp, lambda: status()[0] == "slow")
        assert "answers slowly" in window.status_label.text()
        server.delay_s = 5.0  # past the timeout: not answering
        assert wait_for(qapp, lambda: status()[0] == "down")
        assert "did not answer /metrics within 2 s" in status()[1]
        server.mode = "ok"
        server.stop()  # gone altogether
        assert wait_for(qapp, lambda: status()[0] == "down" and "not answering" in status()[1])
        assert "down" in window.engine_label.text()
        server.start()  # back on the same port
        assert wait_for(qapp, lambda: status()[0] == "connected", timeout=30)
        assert status()[1].startswith("reconnected") and "connected" in window.engine_label.text()
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        assert len(ticks) > 100 and max(gaps) < 1000, max(gaps)  # the event loop kept turning throughout
    finally:
        timer.stop()
        window.close()
        server.stop()
        run_for(qapp, 0.05)


@pytest.mark.llama_server
def test_source_against_llama_server(qapp):
    binary, gguf = str(llama_cpp_peer.tool("llama-server")), str(llama_cpp_peer.bf16_gguf())
    port = free_port()
    proc = subprocess.Popen([binary, "-m", gguf, "--port", str(port), "-np", "2", "-t", "1", "-c", "2048",
                             "--metrics"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    source = RemoteSource(url, scrape_hz=8.0)
    got = Collector(source)
    try:
        wait_http(url + "/health", timeout=120, proc=proc)
        source.start()
        assert wait_for(qapp, lambda: source.info is not None)
        assert source.kind == "llamacpp"
        rid, _ = source.submit_prompt("Hello", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                                      chat=False)
        assert wait_for(qapp, lambda: got.finished(rid) is not None, timeout=60)
        tl = got.finished(rid).timeline
        assert tl.finish_reason == "length" and tl.num_output_tokens == 8 and tl.ttft > 0
        assert wait_for(qapp, lambda: source.facts is not None and source.facts.running is not None)
        assert "TTFT histogram" in source.facts.not_exposed  # llama-server publishes no latency histograms
    finally:
        source.shutdown(10.0)
        proc.terminate()
        proc.wait(20)


def test_presets_say_what_needs_the_embedded_engine():
    from app.gui.preset_actions import needs_embedded
    from app.source.engine_info import Capabilities
    from app.talk import presets

    caps = Capabilities(load_generator=True, server_metrics=True, client_timings=True)
    load = lambda name: presets.load_preset(name, presets.PRESETS_DIR)  # noqa: E731
    kv = needs_embedded(load("kv-cache"), caps, "vLLM at http://x")
    assert kv.startswith("⚠ This preset needs the embedded engine") and "KV block map" in kv
    for traffic in ("traffic-jam", "latency-budget", "continuous-batching", "streaming"):
        text = needs_embedded(load(traffic), caps, "vLLM at http://x")
        assert "works on a server" in text and "the server's own" in text, traffic


def test_file_attach_opens_a_window_on_the_server(qapp):
    server = FlakyServer().start()
    first = MainWindow(RemoteSource(server.url), None, persist=False)  # any source: this one keeps it
    first.controller.interactive = False
    try:
        assert first.attach("not a url://") is None and "not attached" in first.status_label.text()
        second = first.attach(server.url + "/v1")
        assert second is not None and second.host is not first.host
        assert wait_for(qapp, lambda: second.controller.engine_ready)
        assert second.host.name == f"vLLM at {server.url}" and "vLLM at" in second.engine_label.text()
        second.close()
        assert not second.host._thread.is_alive()
    finally:
        first.close()
        server.stop()
        run_for(qapp, 0.05)
