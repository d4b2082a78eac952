"""ReplaySource: a recording (`.inferlab-run`, app/record/) as a third engine source, beside the embedded
engine (app/host/) and an attached server (app/remote/): the same panels, fed from the file.

Threads
  GUI thread     owns the source (Qt-free: its notices, app/source/notice.py, are emitted from the worker and
                 reach the window through app/gui/source_signals.py and the replay bar's own signal):
                 speed, seek and jump post to the worker and return at once; `drain()` hands over what the
                 worker published, as for a live source.
  replay worker  reads the file line by line (never whole: app/record/reader.py), first through to its end
                 without decoding (its length, its knob changes, whether it was cut short), then again,
                 publishing each item when the replay's clock reaches its time (app/replay/clock.py). A seek
                 skips lines undecoded up to LEAD_IN_S before the target, keeping the latest state (the
                 engine's info, snapshots, the knobs), then plays the lead-in at once so the plots have their
                 recent past; a seek backwards reads the file again from its start.

Read-only: its capabilities are the recorded engine's panels (step events, memory, block map, spec, LoRA,
an attached server's facts) with `recorded` on and nothing that acts (no load generator, no knobs, no
rebuild); the controls show the knobs as they were, greyed. Commands that would change the run are ignored
(a preset's own load, knobs and resets), a prompt is refused.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.record.codec import Decoder
from app.record.header import recorded_on
from app.record.reader import RecordingError, open_recording
from app.replay.clock import ReplayClock
from app.source import channel
from app.source.engine_info import Capabilities, EngineInfo
from app.source.notice import Notice
from engine.config import EngineConfig

MAX_EVENTS = 200_000
MAX_QUEUED = 20_000  # the worker waits while the GUI has this many items to drain
LEAD_IN_S = 10.0
STATE_EVERY_S = 0.25
KEPT_KINDS = ("EngineInfo", "MemorySnapshot", "BlockMapSnapshot", "LoraAdapters", "Perplexity", "QuantError",
              "Quantized", "ComputeChanged")  # the latest of each is what a panel shows at any moment
MAX_KNOB_MARKS = 1000
MAX_COMPARISON_BYTES = 4 * 2**20  # the comparisons a recording carries, shown from its start
READ_ONLY = "a recording plays as it was recorded"


@dataclass(frozen=True, slots=True)
class ReplayState:
    """For the replay bar: where the replay is, and what it can jump to."""

    position: float
    duration: float | None  # None until the first pass has read the file to its end
    speed: float
    knob_marks: tuple[tuple[float, str], ...] = ()  # (seconds, what changed)
    ended: bool = False
    note: str = ""  # the file was cut short, items were skipped
    recorded_on: str = ""


def replay_capabilities(recorded: Capabilities) -> Capabilities:
    """The recorded engine's panels, nothing that acts."""
    return replace(recorded, load_generator=False, sweep=False, quantization=False, perplexity=False,
                   rebuild=False, serve=False, reconfigurable=(), restartable=(), recorded=True)


@dataclass
class _Seek:
    target: float
    kept: dict = field(default_factory=dict)


class ReplaySource:
    def __init__(self, path: str | Path, speed: float = 1.0) -> None:
        self.sigLoadProgress = Notice()  # (message, fraction); the load notices, from the replay worker
        self.sigLoaded = Notice()  # (EngineInfo)
        self.sigLoadFailed = Notice()  # (message)
        self.sigReplayState = Notice()  # (ReplayState), for the replay bar
        self.path = Path(path)
        self.name = f"the recording {self.path.name}"
        self.config = EngineConfig()  # the knobs' defaults; the recorded ones come with its info
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self.header: dict = {}
        self.recorded_on = ""
        self.knobs: dict = {}  # the recorded knobs as they are at the replay's position
        self.clock = ReplayClock(speed)
        self.duration: float | None = None
        self.knob_marks: list[tuple[float, str]] = []
        self.note = ""
        self.ended = False
        self.position = 0.0
        self.items_played = 0
        self._events: deque = deque(maxlen=MAX_EVENTS)
        self._lock = threading.Lock()
        self._seek: float | None = None
        self._seek_taken: float | None = None
        self._comparisons: dict[str, bytes] = {}  # preset -> its ComparisonResult line (prepare puts it last)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._state_at = 0.0

    # --- lifecycle (GUI thread) -----------------------------------------------------------------------
    def start(self) -> None:
        self.sigLoadProgress.emit(f"opening {self.path.name}", 0.0)
        self._thread = threading.Thread(target=self._run, name="inferlab-replay", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> bool:
        self._stopping.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def loaded(self) -> bool:
        return self.info is not None

    def drain(self, limit: int | None = None) -> list:
        return channel.drain(self._events, limit)

    # --- the replay's own verbs (GUI thread) --------------------------------------------------------------
    def set_speed(self, speed: float) -> None:
        """1, 2, 4 (times the recorded pace) or 0 (paused)."""
        with self._lock:
            self.clock.set_speed(max(0.0, float(speed)))
        self._wake.set()
        self._publish_state(force=True)

    def seek(self, position: float) -> None:
        """Play from `position` seconds into the recording (the scrubber, a jump to a knob change)."""
        with self._lock:
            self._seek = max(0.0, float(position))
        self._wake.set()

    def state(self) -> ReplayState:
        return ReplayState(self.position, self.duration, self.clock.speed, tuple(self.knob_marks), self.ended,
                           self.note, self.recorded_on)

    # --- the EngineSource commands: a recording is read-only -----------------------------------------------
    def submit_prompt(self, text, params, chat):
        raise RuntimeError(READ_ONLY)

    def add_request(self, prompt, params, **kw):
        raise RuntimeError(READ_ONLY)

    def _ignored(self, *args, **kwargs) -> None:
        """A preset's load, knobs and resets: the recording has its own."""

    abort = reconfigure = reload = quantize = adopt_perplexity = _ignored
    start_load = stop_load = burst = set_load_config = set_arrival_rate = reset = _ignored
    run_measurement = cancel_measurement = use_loras = ask_every_adapter = _ignored

    # --- the worker ---------------------------------------------------------------------------------------
    def _publish(self, item) -> None:
        if isinstance(item, channel.KnobsChanged):
            self.knobs.update(item.values)
        elif isinstance(item, EngineInfo):
            info = replace(item, source=self.name, capabilities=replay_capabilities(item.capabilities))
            self.knobs = dict(item.config)
            first, self.info = self.info is None, info
            if first:
                self.sigLoaded.emit(info)
            return
        self._events.append(item)

    def _run(self) -> None:
        try:
            self._first_pass()
        except RecordingError as exc:
            self.load_error = str(exc)
            self.sigLoadFailed.emit(self.load_error)
            return
        target: float | None = 0.0
        while not self._stopping.is_set():
            target = self._play_from(target or 0.0)
            if target is None:  # played to its end: wait for a seek (or the window closing)
                self.ended = True
                self._publish_state(force=True)
                while not self._stopping.is_set() and self._take_seek() is None:
                    self._wake.wait(0.2)
                    self._wake.clear()
                target = self._seek_taken
                self.ended = False

    def _first_pass(self) -> None:
        """Read it through once, undecoded: its length, its knob changes, whether it is whole."""
        decoder = Decoder()
        with open_recording(self.path) as rec:
            self.header = rec.header
            self.recorded_on = recorded_on(rec.header)
            self.name = f"recording: {self.recorded_on}"
            self.sigLoadProgress.emit(f"reading {self.path.name}", 0.5)
            marks: list[tuple[float, str]] = []
            for t, kind, line in rec.lines():
                if self._stopping.is_set():
                    return
                if kind == "KnobsChanged" and len(marks) < MAX_KNOB_MARKS:
                    item = rec.decode(line, decoder)
                    if item is not None:
                        marks.append((t, item.text or ", ".join(f"{k} {v}" for k, v in item.values.items())))
                elif kind == "ComparisonResult" and sum(map(len, self._comparisons.values())) + len(line) \
                        <= MAX_COMPARISON_BYTES:
                    item = rec.decode(line, decoder)
                    if item is not None:
                        self._comparisons[item.preset] = line
            self.duration, self.knob_marks = rec.last_t, marks
            notes = [rec.cut_short or ""]
            if rec.skipped:
                notes.append(f"{rec.skipped:,} lines skipped ({rec.skip_reason})")
            if rec.ended and rec.ended.get("stopped"):
                notes.append(f"the recording stopped early: {rec.ended['stopped']}")
            self.note = "; ".join(n for n in notes if n)

    def _take_seek(self) -> float | None:
        with self._lock:
            self._seek_taken, self._seek = self._seek, None
        return self._seek_taken

    def _play_from(self, target: float) -> float | None:
        """Play from `target` seconds to the end; returns a new seek target, or None at the end."""
        decoder = Decoder()
        with open_recording(self.path) as rec:
            if target > 0:
                self._events.append(channel.Reset())
            kept: dict[str, bytes] = {}
            knobs: list[bytes] = []
            lines = rec.lines()
            for t, kind, line in lines:
                if t >= target - LEAD_IN_S:
                    self._publish_kept(rec, decoder, kept, knobs)
                    if not self._play_line(rec, decoder, t, kind, line, target):
                        return self._seek_taken
                    break
                if kind in KEPT_KINDS:
                    kept[kind] = line
                elif kind == "KnobsChanged":
                    knobs.append(line)
                elif kind == "Reset":
                    kept.pop("MemorySnapshot", None), kept.pop("BlockMapSnapshot", None)
            else:
                self._publish_kept(rec, decoder, kept, knobs)
            with self._lock:
                self.clock.jump(max(target, 0.0))
            for t, kind, line in lines:
                if not self._play_line(rec, decoder, t, kind, line, target):
                    return self._seek_taken
            if rec.cut_short:
                self._events.append(channel.Message(rec.cut_short))
            else:
                self._events.append(channel.Message(f"end of the recording ({rec.last_t:.1f} s)"))
        return None

    def _publish_kept(self, rec, decoder: Decoder, kept: dict, knobs: list) -> None:
        """The state at the replay's start or a seek's target: the engine's info, the knobs, the latest
        snapshots, and the comparisons the recording carries (shown from the start: they were measured
        with these runs)."""
        for line in ([kept["EngineInfo"]] if "EngineInfo" in kept else []) + knobs[-MAX_KNOB_MARKS:] + [
                v for k, v in kept.items() if k != "EngineInfo"] + list(self._comparisons.values()):
            item = rec.decode(line, decoder)
            if item is not None:
                self._publish(item)

    def _play_line(self, rec, decoder: Decoder, t: float, kind: str, line: bytes, target: float) -> bool:
        """Publish the line's item when the clock reaches it (at once before `target`: the lead-in; and the
        engine's info while none is loaded, paused or not); False when a seek or the window closing ends
        this pass."""
        at_once = t < target or (kind == "EngineInfo" and self.info is None)
        while True:
            if self._stopping.is_set() or self._take_seek() is not None:
                return False
            if len(self._events) > MAX_QUEUED:  # the GUI is behind: let it drain
                self._wake.wait(0.02)
                continue
            with self._lock:
                wait = 0.0 if at_once else self.clock.wait_s(t)
                self.position = max(target, min(t, self.clock.position()))
            self._publish_state()
            if wait is not None and wait <= 0:
                break
            self._wake.wait(0.05 if wait is None else min(0.05, wait))
            self._wake.clear()
        item = rec.decode(line, decoder)
        if item is not None:
            self._publish(item)
            self.items_played += 1
        return True

    def _publish_state(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self._state_at >= STATE_EVERY_S:
            self._state_at = now
            self.sigReplayState.emit(self.state())
