"""Recording an LLMEngine from its Python API, no Qt: a GPU box with no display records too.

    with EngineRecorder("run.inferlab-run", what="bench decode", device="cuda") as rec:
        with rec.follow(engine, "batch 64"):     # one engine's run; several may follow one another
            drive(engine)

While it follows an engine, every step event is recorded as it is published (the engine's listener) with
any knob that changed (a channel.KnobsChanged), and every SNAPSHOT_INTERVAL_S, from inside the same
listener, its memory and block-map snapshots. A snapshot that costs much (a block map of
thousands of blocks) stretches the interval so snapshots take at most SNAPSHOT_MAX_SHARE of the engine's
time. Following an engine first writes its EngineInfo (capabilities, config), a Reset where it is another
engine than the last (a replay clears its panels: another block map), and the run's label as a mark on the
timeline (a replay jumps to it).
"""
from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.record.header import machine_of, make_header
from app.record.writer import DEFAULT_MAX_BYTES, RecordingWriter
from app.source import channel
from app.source.engine_info import make_info

SNAPSHOT_INTERVAL_S = 0.1
SNAPSHOT_MAX_SHARE = 0.05


def knob_change_text(before: dict, after: dict) -> str:
    """"max_num_seqs 8 → 32, chunked prefill off → on": what changed, for the timeline's mark."""
    def show(v) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    return ", ".join(f"{k} {show(before.get(k))} → {show(v)}" for k, v in after.items())


class EngineRecorder:
    def __init__(self, path: str | Path, *, what: str = "", model: str = "", device: str = "cpu",
                 threads: int | None = None, knobs: dict | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 compression: str | None = None, **extra) -> None:
        header = make_header(what, model=model, device=device, threads=threads, knobs=knobs,
                             machine=machine_of(device, threads), **extra)
        self.writer = RecordingWriter(path, header, max_bytes=max_bytes, compression=compression)
        self.path = self.writer.path
        self.source = f"recording of {what}" if what else "recording"
        self._engine: Any = None  # the engine followed now (torch-free: typed loosely)
        self._last_engine: weakref.ref | None = None
        self._knobs: dict = {}
        self._interval = SNAPSHOT_INTERVAL_S
        self._next_snapshot = 0.0

    @classmethod
    def for_engine(cls, engine, path: str | Path, what: str = "", **kw) -> EngineRecorder:
        """A recorder whose header names `engine`'s model, device, threads and knobs."""
        cfg = engine.config
        return cls(path, what=what, model=cfg.model, device=str(engine.device), threads=cfg.num_threads,
                   knobs=cfg.knob_values(), **kw)

    @contextmanager
    def follow(self, engine, label: str = ""):
        """Record `engine` while the block runs (its info first, then its steps and snapshots)."""
        self.attach(engine, label)
        try:
            yield self
        finally:
            self.detach()

    def attach(self, engine, label: str = "") -> None:
        if self._engine is not None:
            self.detach()
        self._engine = engine
        self._knobs = dict(engine.config.knob_values())
        self.writer.put(make_info(engine, self.source))
        if self._last_engine is None or self._last_engine() is not engine:  # another engine: panels start over
            self.writer.put(channel.Reset())
        self._last_engine = weakref.ref(engine)  # (a strong one would keep a finished engine's KV cache alive)
        if label:
            self.writer.put(channel.Message(f"recorded run: {label}"))
            self.writer.put(channel.KnobsChanged({}, f"run: {label}"))  # a mark on the timeline, a jump
        self._snapshot(time.perf_counter())
        engine.add_listener(self._on_step)

    def detach(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        try:
            engine.remove_listener(self._on_step)
        except ValueError:
            pass
        self._snapshot(time.perf_counter())  # the memory as the run left it

    def put(self, item) -> None:
        """Record another channel item (a Message, a LoadStream) as published now."""
        self.writer.put(item)

    def _on_step(self, event) -> None:
        # inside engine.step(): an append, and now and then the snapshots
        self.writer.put(event, event.stats.t_start + event.stats.wall_time_s)
        now = time.perf_counter()
        self._knob_changes(now)  # reconfigure() takes effect at the top of a step: seen at its end
        if now >= self._next_snapshot:
            self._snapshot(now)

    def _snapshot(self, now: float) -> None:
        engine = self._engine
        if engine is None:
            return
        self.writer.put(engine.memory(), now)
        self.writer.put(engine.block_map(), now)
        self._knob_changes(now)
        cost = time.perf_counter() - now
        self._next_snapshot = now + max(self._interval, cost / SNAPSHOT_MAX_SHARE)

    def _knob_changes(self, now: float) -> None:
        knobs = self._engine.config.knob_values()
        if knobs != self._knobs:
            changed = {k: v for k, v in knobs.items() if self._knobs.get(k) != v}
            self.writer.put(channel.KnobsChanged(changed, knob_change_text(self._knobs, changed)), now)
            self._knobs = dict(knobs)

    @property
    def size(self) -> int:
        return self.writer.size

    def close(self) -> None:
        self.detach()
        self.writer.close()

    def __enter__(self) -> EngineRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
