"""Presets that cannot be read or built (issue 12, point 6): a preset file that is not UTF-8 is a
`file:line: why` PresetError; a KV cache larger than the machine's memory is refused at once with the
sizes (before any allocation); a headless --screenshot run that fails shuts the engine thread down
before it exits (no `terminate called without an active exception`)."""
from __future__ import annotations

import sys

import pytest
import torch

from app.talk.presets import PresetError, load_preset
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.runner import setup

GOOD = '[preset]\ntitle = "T"\ncaption = "C"\n[engine]\nmax_num_seqs = 4\n'


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\x80abc"])
@pytest.mark.parametrize("where", ["title", "end"])
def test_non_utf8_preset_is_a_preset_error(tmp_path, bad, where):
    path = tmp_path / "latin.toml"
    text = GOOD.encode()
    data = text.replace(b'"T"', b'"T' + bad + b'"') if where == "title" else text + b"# " + bad + b"\n"
    path.write_bytes(data)
    with pytest.raises(PresetError) as err:
        load_preset(path)
    message = str(err.value)
    line = 2 if where == "title" else GOOD.count("\n") + 1
    assert message.startswith(f"{path}:{line}: not UTF-8 text")
    path.write_bytes(GOOD.encode())
    assert load_preset(path).engine["max_num_seqs"] == 4  # the same file, fixed, loads


def test_kv_cache_larger_than_memory_is_refused_before_allocation(tiny_llama, monkeypatch):
    allocated = []
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: allocated.append(a) or real_zeros(*a, **k))
    with pytest.raises(ValueError, match=r"a KV cache of 1000000000 blocks needs .* GiB but only .* GiB"):
        LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=10**9, block_size=4))
    assert not any(a and isinstance(a[0], tuple) and 10**9 * 4 in a[0] for a in allocated)


def test_the_memory_bound_is_exact(tiny_llama, monkeypatch):
    """The bound is the memory available now: a cache that fits is built, one block more is refused."""
    eng = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=8, block_size=4))
    block = eng.block_bytes
    monkeypatch.setattr(setup, "available_memory_bytes", lambda device: 100 * block)
    cfg = EngineConfig(model=str(tiny_llama), dtype="float32", block_size=4)
    assert setup.num_kv_blocks(EngineConfig(**{**_fields(cfg), "num_kv_blocks": 100}), eng.device, block) == 100
    with pytest.raises(ValueError, match="101 blocks"):
        setup.num_kv_blocks(EngineConfig(**{**_fields(cfg), "num_kv_blocks": 101}), eng.device, block)
    with pytest.raises(ValueError, match="blocks needs"):  # a memory budget beyond the machine too
        setup.num_kv_blocks(EngineConfig(**{**_fields(cfg), "kv_cache_memory_bytes": 200 * block}), eng.device,
                            block)


def _fields(cfg: EngineConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def test_available_memory_is_read_on_linux():
    available = setup.available_memory_bytes(torch.device("cpu"))
    if sys.platform.startswith("linux"):
        assert available is not None and available > 0


def recording_hosts(monkeypatch) -> list:
    import app.host.engine_host as engine_host

    hosts = []

    class RecordingHost(engine_host.EngineHost):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            hosts.append(self)

    monkeypatch.setattr(engine_host, "EngineHost", RecordingHost)
    return hosts


def run_screenshot(argv: list[str]) -> int:
    import asyncio

    from app.cli import build_parser
    from app.gui.launch import run_gui

    try:
        return run_gui(build_parser().parse_args(argv))
    finally:
        loop = asyncio.get_event_loop_policy().get_event_loop()
        if not loop.is_closed():
            loop.close()
        asyncio.set_event_loop(None)


def test_screenshot_with_a_broken_preset_stops_the_engine_thread(qapp, tiny_llama, tmp_path, monkeypatch, capsys):
    """The preset fails while the model loads in the engine thread: run_gui must stop that thread before
    it returns (a daemon thread still in torch code when the interpreter exits can abort it in C++)."""
    hosts = recording_hosts(monkeypatch)
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    broken = tmp_path / "broken.toml"
    broken.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    assert run_screenshot(["--screenshot", str(tmp_path / "out.png"), "--preset", str(broken),
                           "--model", str(tiny_llama)]) == 2
    assert f"{broken}:6: not UTF-8 text" in capsys.readouterr().err
    thread = hosts[0]._thread
    assert thread is not None and not thread.is_alive()
    assert not (tmp_path / "out.png").exists()


def test_screenshot_that_raises_stops_the_engine_thread_first(qapp, tiny_llama, tmp_path, monkeypatch, capsys):
    """Any exception in the screenshot run: the engine thread is stopped, then the traceback shows."""
    import app.gui.launch as gui

    hosts = recording_hosts(monkeypatch)

    async def failing_screenshot(window, host, out, run_seconds, **_options):
        assert await gui.wait_loaded(window, host) is None
        raise RuntimeError("grab failed")

    monkeypatch.setattr(gui, "screenshot", failing_screenshot)
    preset = tmp_path / "good.toml"
    preset.write_text(GOOD + "[workload]\nautostart = false\n")
    assert run_screenshot(["--screenshot", str(tmp_path / "out.png"), "--preset", str(preset),
                           "--model", str(tiny_llama)]) == 1
    assert "RuntimeError: grab failed" in capsys.readouterr().err
    thread = hosts[0]._thread
    assert thread is not None and not thread.is_alive()


def test_a_preset_whose_engine_cannot_be_built_fails_once_and_keeps_the_engine(qapp, tiny_llama, tmp_path,
                                                                               monkeypatch):
    """A preset asks for a KV cache the machine cannot hold: the rebuild fails once with a clear message,
    the app keeps (and runs) its previous engine, and no rebuild loop follows."""
    from app_helpers import close_window, open_window, run_for, wait_until

    window = open_window(tiny_llama)
    ctl, host = window.controller, window.host
    try:
        blocks_before = host.info.config["num_kv_blocks"]
        block_bytes = host.engine.block_bytes
        monkeypatch.setattr(setup, "available_memory_bytes", lambda device: 1000 * block_bytes)
        reloads = []
        real_reload = host.reload
        monkeypatch.setattr(host, "reload", lambda **changes: reloads.append(changes) or real_reload(**changes))
        preset = tmp_path / "huge-kv.toml"
        preset.write_text(GOOD + "num_kv_blocks = 1000000\n[workload]\nautostart = false\n")
        assert ctl.apply_preset(preset)
        wait_until(qapp, lambda: ctl.last_error is not None and "num_kv_blocks" in ctl.last_error, 30)
        run_for(qapp, 1.0)  # long enough for a loop to show itself
        assert len(reloads) == 1 and reloads[0]["num_kv_blocks"] == 1000000
        assert "keeping the previous engine" in ctl.last_error
        assert ctl.engine_ready and host.info.config["num_kv_blocks"] == blocks_before
        assert host.engine.block_manager.num_blocks == blocks_before
        finished_before = host.engine.stats().num_finished
        host.add_request([5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0))
        wait_until(qapp, lambda: host.engine.stats().num_finished > finished_before, 10)  # it still serves
    finally:
        close_window(window)


def test_screenshot_with_report_samples_the_run(qapp, tiny_llama, tmp_path, monkeypatch):
    """--report: the running preset's queue, goodput and latency sampled during the run, with a verdict."""
    import json

    import app.gui.soak as soak

    monkeypatch.setattr(soak.sample_run, "__defaults__", (1.0,))  # a sample every second
    preset = tmp_path / "busy.toml"
    preset.write_text(GOOD + "[workload]\narrival_rate = 4.0\nprompt_tokens = [8, 16]\noutput_tokens = [4, 8]\n"
                      "autostart = true\n")
    report = tmp_path / "report.json"
    assert run_screenshot(["--screenshot", str(tmp_path / "out.png"), "--preset", str(preset), "--model",
                           str(tiny_llama), "--run-seconds", "5", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["preset"] == str(preset) and data["verdict"] in ("keeps up", "queue grows")
    assert len(data["samples"]) >= 4
    assert any(s["finished_in_window"] for s in data["samples"])  # the load ran while it was sampled
    assert all(isinstance(s["waiting"], int) for s in data["samples"])
