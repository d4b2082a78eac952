"""EngineLoop: the one thread that owns and steps an LLMEngine, and fans its events out.

    loop = EngineLoop(config=EngineConfig(...), progress=print)   # or EngineLoop(engine)
    loop.subscribe(my_subscriber)      # on_engine / on_step / on_error, called in the engine thread
    loop.start()
    rid = loop.add_request("Hello", SamplingParams(max_tokens=8))   # raises in the caller's thread
    loop.post(Rebuild({"num_kv_blocks": 512}))                        # typed commands, one queue
    loop.stop()

One command queue (engine/commands.py CommandQueue), owned by the loop: the engine it runs submits its own
verbs (add_request, abort, reconfigure, LoRA, weight swaps) into it too (`attach_queue`), and takes them at
the top of each step; the loop takes the others (Rebuild, AbortAll, RunInLoop, the app's host commands,
dispatched by their type, see `handle`) between steps. The thread loads the model (when given a config),
then loops: run the loop's commands, run the tickers (periodic work such as a load generator's due arrivals
or snapshots; each returns when it next wants to run), `engine.step()` while there is work, else wait until
a command is put (never a busy loop).

Subscribers: the loop puts ONE listener on the engine and hands each step event to every subscriber
(the GUI channel, the HTTP server's streams and metrics, benches). When a Rebuild swaps the engine, the
listener moves to the new engine and every subscriber's `on_engine` runs again, so nobody keeps
listening to the old one. Subscribers run inside `engine.step()`: they must only hand data over.

One bad command fails alone (its subscribers hear of it through `on_error`); a step that raises is
reported the same way and the loop keeps serving.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from engine.commands import ENGINE_COMMANDS, CommandQueue
from engine.config import EngineConfig
from engine.drive import drive
from engine.events import EngineStepEvent
from engine.serving.commands import AbortAll, Rebuild, RunInLoop

IDLE_WAIT_S = 0.1  # a safety net: requests, aborts and commands wake the thread at once
STEP_ERROR_PAUSE_S = 0.1  # after a step raised: do not spin on a broken engine
ABORT_DEADLINE_S = 5.0


class FailureKind(Enum):
    LOAD = "load"  # the model could not be loaded: the loop ends
    COMMAND = "command"  # a command raised (or had no handler): the loop goes on
    STEP = "step"  # engine.step() raised: open requests cannot finish; the loop goes on
    REBUILD = "rebuild"  # the new engine could not be built: the previous one keeps serving


@dataclass(frozen=True, slots=True)
class LoopFailure:
    kind: FailureKind
    message: str


class EngineUnavailable(RuntimeError):
    """No engine takes requests right now (still loading, or being rebuilt); try again shortly."""


class Subscriber:
    """What the loop calls, always in the engine thread. Override what you need; keep it short."""

    def on_engine(self, engine) -> None:
        """An engine is attached: the first one, or a rebuilt one (also the old one after a failed build)."""

    def on_step(self, event: EngineStepEvent) -> None:
        """One step's immutable event (inside engine.step(): hand it over, never wait)."""

    def on_error(self, failure: LoopFailure) -> None:
        """A command, a step, a load or a rebuild failed."""


class EngineLoop:
    def __init__(self, engine=None, *, config: EngineConfig | None = None,
                 progress: Callable[[str, float], None] | None = None,
                 build: Callable[..., object] | None = None, name: str = "inferlab-engine",
                 idle_wait_s: float = IDLE_WAIT_S) -> None:
        """engine: an already-built LLMEngine; else `config` is built in the loop's thread (with `progress`).
        build(config, progress=...) makes an engine (default: LLMEngine), for the first load and rebuilds."""
        if engine is None and config is None:
            raise ValueError("EngineLoop needs an engine or a config")
        self.config = config if config is not None else engine.config
        self.load_error: str | None = None
        self._engine = engine
        self._progress = progress
        self._build = build
        self._name = name
        self._idle_wait_s = idle_wait_s
        self._accepting = False  # requests go to the engine (False while loading or rebuilding)
        self._engine_lock = threading.Lock()  # add_request vs. the engine swap
        self._subs_lock = threading.Lock()
        self._subscribers: tuple[Subscriber, ...] = ()  # copy-on-write: the step path reads it lock-free
        self._tickers: tuple[Callable[[float], float], ...] = ()
        self._handlers: dict[type, Callable] = {Rebuild: lambda c: self.rebuild(c.changes),
                                                AbortAll: lambda _c: self.abort_all(),
                                                RunInLoop: lambda c: c.work(self._engine)}
        self.commands = CommandQueue()  # the one queue: the engine's verbs and the loop's commands
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: set[str] = set()  # request ids in the engine (engine thread only)

    # --- lifecycle (any thread) -----------------------------------------------------------------
    def start(self) -> EngineLoop:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop after the step in flight; True when the thread ended within `timeout`. From now on
        add_request raises EngineUnavailable; requests still in the engine end with "abort"."""
        with self._engine_lock:
            self._stop.set()  # under the lock: an add_request either got in before, or is refused
        self.commands.wake()
        if self._thread is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def engine(self):
        """The engine now attached (None while the first one loads)."""
        return self._engine

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def live_request_ids(self) -> frozenset[str]:
        return frozenset(self._live)

    # --- wiring (any thread) ----------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber) -> Subscriber:
        """Add a subscriber; if an engine is attached, its on_engine runs now (in the caller's thread)."""
        with self._subs_lock:
            self._subscribers = (*self._subscribers, subscriber)
            if self._engine is not None and self._accepting:
                subscriber.on_engine(self._engine)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._subs_lock:
            self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

    def add_ticker(self, tick: Callable[[float], float]) -> None:
        """tick(now) runs in the engine thread before every step or wait; it returns when (perf_counter)
        it next wants to run, which bounds the idle wait."""
        self._tickers = (*self._tickers, tick)

    def handle(self, command_type: type, handler: Callable) -> None:
        """handler(command) runs in the engine thread for every posted command of this type."""
        self._handlers[command_type] = handler

    def post(self, command) -> None:
        """Queue a typed command for the engine thread (which it wakes)."""
        self.commands.put(command)

    # --- requests (any thread; thread-safe in the engine) ---------------------------------------
    def add_request(self, prompt, params, **kw) -> str:
        """Queue a request now; raises ValueError / RequestRejected (from the engine) or EngineUnavailable."""
        with self._engine_lock:
            if self._stop.is_set():
                raise EngineUnavailable("the engine loop has stopped; it takes no more requests")
            if not self._accepting:
                raise EngineUnavailable("the model is still loading" if self._engine is None
                                        else "the engine is being rebuilt; try again in a moment")
            return self._engine.add_request(prompt, params, **kw)  # into self.commands

    def abort(self, request_id: str) -> None:
        engine = self._engine
        if engine is not None:
            engine.abort(request_id)  # into self.commands

    def reconfigure(self, **knobs) -> None:
        """Scheduling knobs (LLMEngine.RECONFIGURABLE), applied at the next step; ValueError for a bad one."""
        if self._engine is None:
            raise EngineUnavailable("the model is still loading")
        self._engine.reconfigure(**knobs)  # into self.commands

    # --- engine thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._engine or self._make(self.config)
        except Exception as exc:  # a bad model must not take the process down
            self.load_error = f"{type(exc).__name__}: {exc}"
            self._notify_error(LoopFailure(FailureKind.LOAD, self.load_error))
            return
        if engine.config.num_threads:
            import torch  # torch's CPU thread count is per OS thread: set it in the one that steps

            torch.set_num_threads(engine.config.num_threads)
        self._attach(engine)
        try:
            self._loop()
            self._abort_leftovers()
        finally:
            self._engine.remove_listener(self._fan_out)

    def _make(self, config: EngineConfig):
        if self._build is not None:
            return self._build(config, progress=self._progress)
        from engine.llm_engine import LLMEngine

        return LLMEngine(config, progress=self._progress)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            now = time.perf_counter()
            next_due = now + self._idle_wait_s
            for tick in self._tickers:
                next_due = min(next_due, tick(now))
            self.commands.clear_wake()  # before the check, so a put between check and wait is not lost
            engine = self._engine  # a command may have replaced it
            if engine.has_unfinished():
                self._step(engine)
            elif not self.commands:
                self.commands.wait(max(0.0, next_due - time.perf_counter()))

    def _step(self, engine) -> None:
        try:
            engine.step()
        except Exception as exc:  # a bug in a step: tell the subscribers, keep serving
            self._notify_error(LoopFailure(FailureKind.STEP, f"{type(exc).__name__}: {exc}"))
            self._stop.wait(STEP_ERROR_PAUSE_S)

    def _run_commands(self) -> None:
        """The loop's commands (every kind but the engine's, which its step takes), oldest first."""
        while commands := self.commands.take(ENGINE_COMMANDS, others=True):
            for command in commands:
                self._run_command(command)

    def _run_command(self, command) -> None:
        handler = self._handlers.get(type(command))
        try:
            if handler is None:
                raise TypeError(f"no handler for {command!r}")
            handler(command)
        except Exception as exc:  # one bad command is reported, the loop goes on
            self._notify_error(LoopFailure(FailureKind.COMMAND,
                                           f"{type(command).__name__}: {type(exc).__name__}: {exc}"))

    def _fan_out(self, event: EngineStepEvent) -> None:
        # the loop's one listener, inside engine.step()
        for rid, _t, _n in event.arrived:
            self._live.add(rid)
        for tl in event.finished:
            self._live.discard(tl.request_id)
        for sub in self._subscribers:
            sub.on_step(event)

    def _attach(self, engine) -> None:
        engine.attach_queue(self.commands)
        engine.add_listener(self._fan_out)
        with self._subs_lock:  # held through the notices: a subscribe() now sees the new engine once
            with self._engine_lock:
                self._engine = engine
                self._live.clear()
                self._accepting = True
            for sub in self._subscribers:
                sub.on_engine(engine)

    def _abort_leftovers(self) -> None:
        """On stop and before a rebuild: requests added before it end with "abort" (their callers stop
        waiting), never left open."""
        try:
            if self._engine.has_unfinished():
                self._engine.step()  # takes the queued requests: those added just before are live, so abortable
            self.abort_all()
        except Exception as exc:  # noqa: BLE001 (a failing step: report it, the loop ends anyway)
            self._notify_error(LoopFailure(FailureKind.STEP, f"{type(exc).__name__}: {exc}"))

    def _notify_error(self, failure: LoopFailure) -> None:
        for sub in self._subscribers:
            sub.on_error(failure)

    def abort_all(self, request_ids: Sequence[str] | None = None) -> None:
        """Abort these live requests (default: all) and step until they are gone (engine thread)."""
        ids = set(self._live if request_ids is None else request_ids)
        engine = self._engine
        for rid in ids:
            engine.abort(rid)
        deadline = time.perf_counter() + ABORT_DEADLINE_S
        drive(engine, until=lambda: not ids & self._live or time.perf_counter() >= deadline)

    def rebuild(self, changes) -> None:
        """A new engine with changed EngineConfig fields (engine thread); on failure the old one keeps
        serving. Either way every subscriber is re-attached (on_engine) to the engine that runs."""
        with self._engine_lock:
            self._accepting = False  # new requests are refused until the swap
        old = self._engine
        self._abort_leftovers()  # the streams of the old engine's requests end with "abort"
        old.remove_listener(self._fan_out)
        old.detach_queue()  # commands put from now on are the next engine's
        released = not old.has_unfinished()  # (an abort that did not finish in time: keep it whole)
        if released:  # its KV cache makes room for the new engine's (a GPU holds one)
            old.release_memory()
        try:
            engine = self._make(replace(old.config, **dict(changes)))
        except Exception as exc:
            engine = old
            if released:
                old.restore_memory()
            self._notify_error(LoopFailure(FailureKind.REBUILD, f"rebuild failed, keeping the previous "
                                                                f"engine: {type(exc).__name__}: {exc}"))
        del old  # its cycles are collected where the owner says (the app: in the GUI thread), never here
        self.config = engine.config
        self._attach(engine)

