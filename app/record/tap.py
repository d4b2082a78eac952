"""ChannelRecorder: the items a source's drain() hands the panels, written down as they pass (the app's
File → Record and `inferlab --record`): whatever the source is (the embedded engine, an attached or a
managed server), its recording is its channel. Qt-free; the GUI calls `add` with each drained batch."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from app.record.engine_recorder import knob_change_text
from app.record.header import machine_of, make_header
from app.record.writer import DEFAULT_MAX_BYTES, RecordingWriter
from app.source import channel
from app.source.engine_info import EngineInfo
from engine.events import EngineStepEvent


def item_time(item, now: float) -> float:
    """When the item happened (perf_counter), where it says; else when it was drained."""
    if isinstance(item, EngineStepEvent):
        return item.stats.t_start + item.stats.wall_time_s
    t = getattr(item, "t", None)
    return t if isinstance(t, float) and abs(now - t) < 60 else now


class ChannelRecorder:
    def __init__(self, path: str | Path, info: EngineInfo, *, what: str = "the app", knobs: dict | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES, **extra) -> None:
        device = info.device if info.device.startswith(("cpu", "cuda")) else "cpu"
        threads = info.config.get("num_threads") if isinstance(info.config.get("num_threads"), int) else None
        header = make_header(what, model=info.model, device=info.device, threads=threads,
                             knobs={**info.config, **(knobs or {})}, machine=machine_of(device, threads), **extra)
        self.writer = RecordingWriter(path, header, max_bytes=max_bytes)
        self.path = self.writer.path
        self._knobs = dict(knobs or {})
        self.add_info(info)

    def add_info(self, info: EngineInfo) -> None:
        """The source's info (at the start, and again after a rebuild): capabilities and config for a replay."""
        self.writer.put(replace(info, config=dict(info.config)))

    def add(self, items: list) -> None:
        now = time.perf_counter()
        for item in items:
            self.writer.put(item, item_time(item, now))

    def knobs(self, knobs: dict) -> None:
        """The knobs as the app has them now: a change is recorded with its time."""
        changed = {k: v for k, v in knobs.items() if self._knobs.get(k) != v}
        if changed:
            self.writer.put(channel.KnobsChanged(changed, knob_change_text(self._knobs, changed)))
            self._knobs.update(changed)

    @property
    def size(self) -> int:
        return self.writer.size

    @property
    def stopped(self) -> str | None:
        return self.writer.stopped

    def close(self) -> None:
        self.writer.close()
