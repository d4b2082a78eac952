"""The engine-source seam: the window runs on any EngineSource; what a source's declared capabilities
leave out, the GUI says on screen (here a fake remote source without a block map or quantization)."""
from __future__ import annotations

import threading

from app_helpers import run_for

from app.gui.main_window import MainWindow
from app.host.engine_host import EngineHost
from app.source.engine_info import Capabilities, EngineInfo
from app.source.engine_source import EngineSource
from app.source.notice import Notice
from engine.config import EngineConfig


class FakeRemoteSource:
    """What a remote OpenAI-compatible server could offer: step-level events, no memory internals."""

    name = "remote-fake"

    def __init__(self) -> None:
        self.sigLoadProgress, self.sigLoaded, self.sigLoadFailed = Notice(), Notice(), Notice()
        self.config = EngineConfig()
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self.knobs: list[dict] = []

    def start(self) -> None: ...
    def shutdown(self, timeout: float = 5.0) -> bool: return True
    @property
    def loaded(self) -> bool: return self.info is not None
    def drain(self, limit: int | None = None) -> list: return []
    def submit_prompt(self, text, params, chat): raise RuntimeError("read-only source")
    def add_request(self, prompt, params, **kw): raise RuntimeError("read-only source")
    def abort(self, request_id: str) -> None: ...
    def reconfigure(self, **knobs) -> None: self.knobs.append(knobs)
    def reload(self, **config_changes) -> None: raise AssertionError("this source cannot rebuild")
    def quantize(self, bits: int) -> None: raise AssertionError("this source cannot quantize")
    def adopt_perplexity(self, by_bits) -> None: raise AssertionError("this source cannot quantize")
    def start_load(self) -> None: ...
    def stop_load(self) -> None: ...
    def burst(self, n: int) -> None: ...
    def set_load_config(self, config) -> None: ...
    def set_arrival_rate(self, rate: float) -> None: ...
    def reset(self) -> None: ...
    def run_measurement(self, job) -> None: ...
    def cancel_measurement(self) -> None: ...
    def use_loras(self, mix) -> None: ...
    def ask_every_adapter(self, prompt: str, chat: bool = True) -> None: raise AssertionError("no LoRA here")


def test_both_sources_implement_the_interface():
    assert isinstance(FakeRemoteSource(), EngineSource)
    assert isinstance(EngineHost(EngineConfig()), EngineSource)  # not started: nothing loads


def test_the_gui_says_what_a_source_does_not_expose(qapp):
    source = FakeRemoteSource()
    window = MainWindow(source, None, persist=False)
    window.controller.interactive = False
    try:
        caps = Capabilities(step_events=True, reconfigurable=("max_num_seqs",))
        source.info = EngineInfo(source=source.name, model="remote-model", model_path="http://x:8000", device="?",
                                 dtype="?", max_model_len=2048, num_kv_blocks=0, block_size=16, capabilities=caps)
        source.sigLoaded.emit(source.info)  # as a source does once it knows what it runs
        run_for(qapp, 0.05)
        memory = window.panels.memory
        assert not memory.is_available()
        assert "not exposed by remote-fake" in memory.overlay_text()
        assert "block map" in memory.overlay_text()
        assert window.panels.timeline.is_available()  # step events are exposed
        unavailable = window.panels.controls.snapshot_data()["unavailable"]
        assert unavailable["quant_bits"] == "Weight bits: not offered by remote-fake"
        assert "arrival_rate" in unavailable and "max_num_seqs" not in unavailable
        values = window.panels.controls.snapshot_data()["values"]  # the knobs start at EngineConfig's defaults
        assert values["max_num_seqs"] == EngineConfig().max_num_seqs
        assert values["max_num_batched_tokens"] == EngineConfig().max_num_batched_tokens
        assert source.knobs  # the controller pushed its knobs to this source, through the interface
        window.controller._on_config_changed({"quant_bits": 4})  # a knob the source lacks changes nothing
        assert window.controller.config["quant_bits"] == 16
    finally:
        window.close()
        window.deleteLater()
        run_for(qapp, 0.05)


def test_load_notices_from_a_worker_thread_reach_the_window_in_the_gui_thread(qapp, monkeypatch):
    """The sources are Qt-free and emit from their worker threads; the window's slots must still run in the
    GUI thread (they touch widgets), as they did when the sources' signals were queued Qt signals."""
    seen: list[tuple[str, threading.Thread]] = []
    for slot in ("_on_load_progress", "_on_load_failed"):
        original = getattr(MainWindow, slot)

        def recording(self, message, *rest, _original=original):
            seen.append((message, threading.current_thread()))
            _original(self, message, *rest)
        monkeypatch.setattr(MainWindow, slot, recording)
    source = FakeRemoteSource()
    window = MainWindow(source, None, persist=False)
    window.controller.interactive = False
    try:
        worker = threading.Thread(target=lambda: (source.sigLoadProgress.emit("loading", 0.5),
                                                  source.sigLoadFailed.emit("no such model")))
        worker.start()
        worker.join(5)
        run_for(qapp, 0.1)
        assert [message for message, _ in seen] == ["loading", "no such model"]
        assert all(thread is threading.main_thread() for _, thread in seen), seen
        assert window.engine_label.text() == "no model"
    finally:
        window.close()
        window.deleteLater()
        run_for(qapp, 0.05)
