"""EngineHost: the engine in its own thread, and the one channel its events take to the GUI.

Threads
  GUI thread     owns the host (a QObject). Calls the command methods below; drains `drain()` on a timer.
  engine thread  loads the model (progress -> queued Qt signals), then loops: run commands, submit due
                 load-generator arrivals, `engine.step()` while there is work, else wait on an Event
                 (woken by any command; never a busy loop).

The engine listener only appends the immutable EngineStepEvent to a deque (appends are atomic), so a
step never waits for the GUI. Every ~100 ms the engine thread also appends `engine.runner.memory()` and
`engine.block_map()` snapshots to the same deque; the snapshot interval stretches when a snapshot is
expensive (thousands of blocks) so snapshots stay under ~5% of the engine's time.

The GUI thread never calls torch: `add_request` runs the tokenizer and queues the request (the engine
makes its torch.Generator when it drains the request), `reconfigure` and `abort` only queue.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque

from PySide6.QtCore import QObject, Signal

from app import engine_work
from app.engine_info import EngineInfo, make_info
from app.load.generator import LoadConfig, LoadGenerator
from app.roofline_feed import roofline_at_load
from engine.config import EngineConfig
from engine.events import EngineStepEvent

SNAPSHOT_INTERVAL_S = 0.1
SNAPSHOT_MAX_SHARE = 0.05  # snapshots may take at most this share of the engine thread's time
IDLE_WAIT_S = 0.1
MAX_EVENTS = 200_000  # the channel's cap if the GUI stops draining (oldest dropped)


class EngineHost(QObject):
    sigLoadProgress = Signal(str, float)
    sigLoaded = Signal(object)  # EngineInfo
    sigLoadFailed = Signal(str)

    def __init__(self, config: EngineConfig, *, engine=None, load_seed: int = 0, parent: QObject | None = None) -> None:
        """engine: an already-loaded LLMEngine to host (benchmarks); else `config` is loaded in start()."""
        super().__init__(parent)
        self.config = config
        self.engine = engine
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self._load_seed = load_seed
        self._events: deque = deque(maxlen=MAX_EVENTS)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.sweep_cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: set[str] = set()  # request ids in the engine (engine thread only)
        self._ours: set[str] = set()  # of those, the load generator's
        self.loadgen: LoadGenerator | None = None
        self.snapshot_interval_s = SNAPSHOT_INTERVAL_S
        self.perplexity: dict[int, float] = {}  # weight bits -> perplexity on the held-out text

    # --- lifecycle (GUI thread) -----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inferlab-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop the engine thread; True when it ended within `timeout` (a model load cannot be cut short)."""
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def loaded(self) -> bool:
        return self.info is not None

    def drain(self, limit: int | None = None) -> list[tuple]:
        """Everything the engine thread published since the last call, oldest first."""
        out = []
        pop = self._events.popleft
        try:
            while limit is None or len(out) < limit:
                out.append(pop())
        except IndexError:
            pass
        return out

    # --- commands (any thread) --------------------------------------------------------------------
    def add_request(self, prompt, params, **kw) -> str:
        """Queue a request now (raises ValueError for a bad one, in the caller's thread)."""
        rid = self._require_engine().add_request(prompt, params, **kw)
        self._wake.set()
        return rid

    def abort(self, request_id: str) -> None:
        self._require_engine().abort(request_id)
        self._wake.set()

    def reconfigure(self, **knobs) -> None:
        """Scheduling knobs (engine.RECONFIGURABLE); raises ValueError for a bad one."""
        self._require_engine().reconfigure(**knobs)
        self._wake.set()

    def start_load(self) -> None:
        self._post("start_load")

    def stop_load(self) -> None:
        self._post("stop_load")

    def burst(self, n: int) -> None:
        self._post("burst", int(n))

    def submit_batch(self, arrivals: list) -> None:
        """Submit fixed Arrivals as load-generator requests, from the engine thread (benchmarks)."""
        self._post("submit", list(arrivals))

    def set_load_config(self, config: LoadConfig) -> None:
        self._post("load_config", config)

    def set_arrival_rate(self, rate: float) -> None:
        self._post("load_rate", float(rate))

    def reload(self, **config_changes) -> None:
        """Rebuild the engine with changed EngineConfig fields (e.g. the KV budget), in the engine
        thread, with progress; sigLoaded fires again when the new engine runs. Requests are aborted."""
        self.info = None  # commands are refused ("still loading") until the new engine is up
        self._post("reload", config_changes)

    def quantize(self, bits: int) -> None:
        """Requantize the weights from the originals (engine thread, with ("busy", …) progress), then
        measure perplexity on the held-out text for this and for 16 bits if not known yet."""
        self._post("quantize", int(bits))

    def reset(self) -> None:
        """Stop the load, abort every request; a ("reset",) marker follows their last events."""
        self.sweep_cancelled.set()
        self._post("reset")

    def run_sweep(self, sweep) -> None:
        """Run `sweep(host)` in the engine thread (see app/sweep.py); events keep flowing meanwhile."""
        self.sweep_cancelled.clear()
        self._post("sweep", sweep)

    def cancel_sweep(self) -> None:
        self.sweep_cancelled.set()

    def _post(self, name: str, arg=None) -> None:
        self._commands.put((name, arg))
        self._wake.set()

    def _require_engine(self):
        if self.engine is None or self.info is None:
            raise RuntimeError("the model is still loading")
        return self.engine

    # --- engine thread ----------------------------------------------------------------------------
    def publish(self, kind: str, payload=None) -> None:
        self._events.append((kind, payload))

    def _on_step(self, event: EngineStepEvent) -> None:
        # runs inside engine.step(): keep it to a few appends
        self._events.append(("step", event))
        for rid, _t, _n in event.arrived:
            self._live.add(rid)
        for tl in event.finished:
            self._live.discard(tl.request_id)
            if tl.request_id in self._ours:
                self._ours.discard(tl.request_id)
                self.loadgen.on_finished(tl.request_id, tl.finished or 0.0)  # closed-loop users (issue 6)

    def _run(self) -> None:
        try:
            if self.engine is None:
                from engine.llm_engine import LLMEngine

                self.engine = LLMEngine(self.config, progress=self.sigLoadProgress.emit)
            elif self.engine.config.num_threads:
                import torch  # torch's CPU thread count is per OS thread: set it in the one that runs the steps

                torch.set_num_threads(self.engine.config.num_threads)
            self.info = make_info(self.engine)
            self.loadgen = LoadGenerator(LoadConfig(), self.engine.tokenizer, self._load_seed,
                                         max_model_len=self.engine.max_model_len)
        except Exception as exc:  # a bad model must not take the window down
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.sigLoadFailed.emit(self.load_error)
            return
        self.engine.add_listener(self._on_step)
        self.sigLoaded.emit(self.info)
        self.publish("roofline", roofline_at_load(self.engine))  # cached after the first start
        try:
            self._loop()
        finally:
            self.engine.remove_listener(self._on_step)

    def _loop(self) -> None:
        next_snapshot = 0.0
        while not self._stop.is_set():
            self._run_commands()
            engine = self.engine  # a reload command may have replaced it
            self.submit_due(time.perf_counter())
            self._wake.clear()
            if engine.has_unfinished():
                engine.step()
            elif self._commands.empty():
                wait = min(IDLE_WAIT_S, max(0.0, self.loadgen.next_due() - time.perf_counter()))
                self._wake.wait(wait)
            if time.perf_counter() >= next_snapshot:
                next_snapshot = self.take_snapshots()

    def take_snapshots(self) -> float:
        """Publish memory and block-map snapshots; returns when the next one is due."""
        t0 = time.perf_counter()
        self._events.append(("memory", self.engine.memory()))
        self._events.append(("blocks", self.engine.block_map()))
        cost = time.perf_counter() - t0
        return t0 + max(self.snapshot_interval_s, cost / SNAPSHOT_MAX_SHARE)

    def submit_due(self, now: float) -> int:
        """Submit the load generator's due arrivals; returns how many were accepted."""
        n = 0
        for arrival in self.loadgen.due(now):
            if self.submit(arrival):
                n += 1
        return n

    def submit(self, arrival) -> bool:
        """Submit one Arrival as a load-generator request (engine thread); False when refused."""
        from engine.sampling_params import SamplingParams

        now = time.perf_counter()
        try:
            rid = self.engine.add_request(arrival.prompt_token_ids, SamplingParams(**arrival.sampling))
        except ValueError as exc:
            self.publish("error", f"load generator request refused: {exc}")
            self.loadgen.on_submitted(None, arrival, now)
            return False
        except Exception as exc:  # admission control (RequestRejected): the timeline marks it
            if type(exc).__name__ != "RequestRejected":
                raise
            self.loadgen.on_submitted(None, arrival, now)
            return False
        self.loadgen.on_submitted(rid, arrival, now)
        self._ours.add(rid)
        self.publish("loadgen", (rid, arrival.kind, arrival.prompt_token_ids))
        return True

    def _run_commands(self) -> None:
        while True:
            try:
                name, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                self._command(name, arg)
            except Exception as exc:  # one bad command is reported, the loop goes on
                self.publish("error", f"{name}: {type(exc).__name__}: {exc}")

    def _command(self, name: str, arg) -> None:
        gen, now = self.loadgen, time.perf_counter()
        if name == "start_load":
            gen.start(now)
        elif name == "stop_load":
            gen.stop()
        elif name == "burst":
            gen.burst(arg, now)
        elif name == "load_config":
            gen.set_config(arg, now)
        elif name == "load_rate":
            gen.set_rate(arg, now)
        elif name == "reset":
            gen.clear()
            self.abort_all()
            self.publish("reset")
        elif name == "sweep":
            arg(self)
        elif name == "reload":
            self._rebuild(arg)
        elif name == "quantize":
            engine_work.quantize(self, arg)
        elif name == "submit":
            for arrival in arg:
                self.submit(arrival)
        else:
            raise ValueError(f"unknown command {name!r}")

    def _rebuild(self, changes: dict) -> None:
        """A new engine with changed EngineConfig fields; on failure the old one keeps serving."""
        from dataclasses import replace

        from engine.llm_engine import LLMEngine

        self.loadgen.clear()
        self.abort_all()
        old = self.engine
        old.remove_listener(self._on_step)
        try:
            self.engine = LLMEngine(replace(old.config, **changes), progress=self.sigLoadProgress.emit)
        except Exception as exc:
            self.engine = old
            self.publish("error", f"rebuild failed, keeping the previous engine: {type(exc).__name__}: {exc}")
        del old  # its cycles are collected in the GUI thread (app.gui_gc), never here
        self.loadgen = LoadGenerator(self.loadgen.config, corpus_ids=self.loadgen.corpus_ids,
                                     rng_seed=self._load_seed, max_model_len=self.engine.max_model_len)
        self._live.clear()
        self._ours.clear()
        self.engine.add_listener(self._on_step)
        self.publish("reset")
        self.info = make_info(self.engine)
        self.sigLoaded.emit(self.info)

    def abort_all(self, only_ours: bool = False) -> None:
        """Abort every live request (or only the load generator's) and step until they are gone."""
        ids = set(self._ours if only_ours else self._live)
        for rid in ids:
            self.engine.abort(rid)
        deadline = time.perf_counter() + 5.0
        while ids & self._live and time.perf_counter() < deadline:
            self.engine.step()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def live_request_ids(self) -> frozenset[str]:
        return frozenset(self._live)
