"""The roof probe never holds the engine up: sizes that adapt to a slow dtype, a time limit, and a
thread of its own that starts after the first tokens (engine/perf/probe.py, app/tradeoff/roofline_feed.py)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from app.host.engine_host import EngineHost
from app.source import channel
from app.tradeoff.roofline_feed import PROBE_WAITING
from engine import EngineConfig, SamplingParams
from engine.events import EngineStepEvent
from engine.perf import probe
from engine.perf.roofline import Roofs

ROOFS = Roofs("test cpu", 1, "test", {"bfloat16": 1e11, "float32": 2.5e10}, 1e10, "synthetic (test)", "now")


def test_an_emulated_dtype_is_measured_small_not_for_minutes(monkeypatch):
    """A GEMM as slow as bf16 on a Zen 3 (0.27 GFLOP/s): the old probe's 2048^3 took ~64 s a call."""
    real_mm = torch.mm

    def crawl(a, b):
        if a.dtype == torch.bfloat16:
            time.sleep(2 * a.shape[0] ** 3 / 0.27e9)
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", crawl)
    t0 = time.perf_counter()
    flops, size = probe.measure_gemm(torch.bfloat16, torch.device("cpu"), repeats=3)
    assert size == probe.GEMM_MIN_SIZE  # 256^3 already takes 0.12 s, long enough to time
    assert time.perf_counter() - t0 < 5
    assert flops < 0.3e9


def test_the_probe_keeps_its_time_limit():
    t0 = time.perf_counter()
    roofs = probe.measure_roofs(gemm_size=512, stream_bytes=2**24, time_limit_s=0.0)
    assert time.perf_counter() - t0 < 10
    assert "cut short" in roofs.how and set(roofs.peak_flops) == {"bfloat16", "float32"}
    assert roofs.bandwidth_bytes_per_s > 0


def _drain_until(host, predicate, timeout_s: float) -> list:
    seen: list = []
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        seen += host.drain()
        if predicate(seen):
            return seen
        time.sleep(0.02)
    raise TimeoutError(f"not seen within {timeout_s} s")


def _roof_items(seen: list) -> list[dict]:
    return [item.payload for item in seen if isinstance(item, channel.RooflineAtLoad)]


@pytest.mark.slow
def test_the_engine_serves_while_the_roofs_are_probed(tiny_llama, monkeypatch):
    """Fails on the old code: it probed inside the engine thread's load, so no step ran until the
    probe ended (~6 minutes on a CPU that emulates bf16)."""
    release, probed_in = threading.Event(), []

    def slow_probe(device=None, cache_dir=None, refresh=False, **kw):
        probed_in.append(threading.current_thread().name)
        release.wait(60)
        return ROOFS

    monkeypatch.setattr(probe, "cached_roofs", lambda *a, **k: None)  # a machine never probed
    monkeypatch.setattr(probe, "probe_roofs", slow_probe)
    host = EngineHost(EngineConfig(model=str(tiny_llama), num_kv_blocks=32, block_size=4, num_threads=1))
    host.start()
    try:
        deadline = time.perf_counter() + 60
        while not host.loaded and time.perf_counter() < deadline:
            assert host.load_error is None, host.load_error
            time.sleep(0.05)
        rid = host.add_request([5, 17, 42, 99], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        seen = _drain_until(host, lambda s: any(isinstance(e, EngineStepEvent) and
                                                any(t.request_id == rid for t in e.finished) for e in s), 30)
        assert PROBE_WAITING in [p.get("status") for p in _roof_items(seen)]
        assert all(p.get("roofs") is None for p in _roof_items(seen))
        release.set()
        seen += _drain_until(host, lambda s: any(p.get("roofs") == ROOFS for p in _roof_items(s)), 30)
        assert probed_in == ["inferlab-roof-probe"]
    finally:
        release.set()
        host.shutdown()


@pytest.mark.parametrize("change", [{"bandwidth_bytes_per_s": 0}, {"bandwidth_bytes_per_s": -1.0},
                                    {"bandwidth_bytes_per_s": "nan"}, {"peak_flops": {}},
                                    {"peak_flops": {"bfloat16": "inf"}}, {"threads": 0},
                                    {"peak_flops": ["not", "a", "dict"]}, {"machine": None, "threads": "two"}])
def test_a_lying_roofs_cache_is_measured_again_not_believed(tmp_path, change):
    """A cache edited or damaged into a zero, negative, infinite or missing roof would divide by zero in
    every verdict or show a figure nobody measured: it counts as no cache."""
    import json

    import torch

    from engine.perf import probe

    good = {"machine": "m", "threads": 1, "torch_version": torch.__version__, "peak_flops": {"bfloat16": 1e11},
            "bandwidth_bytes_per_s": 1e10, "how": "h", "measured_at": "2026-12-04T00:00:00+00:00"}
    path = probe.cache_path(torch.device("cpu"), tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(good))
    assert probe.cached_roofs(torch.device("cpu"), tmp_path).ridge_intensity == 10.0
    path.write_text(json.dumps({**good, **change}))
    assert probe.cached_roofs(torch.device("cpu"), tmp_path) is None
