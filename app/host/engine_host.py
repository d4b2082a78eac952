"""EngineHost: the embedded engine as an engine source (app/source/engine_source.py) for the GUI.

Threads
  GUI thread     owns the host. Calls the command methods below; drains `drain()` on a timer.
  engine loop    engine/serving/loop.py EngineLoop, the one thread that owns the engine: loads the model
                 (progress -> its load notices, app/source/notice.py), then runs typed commands
                 (app/host/host_commands.py, the loop's Rebuild), submits due load-generator arrivals (a
                 ticker), `engine.step()` while there is work, else waits on an Event (woken by any command;
                 never a busy loop). The HTTP server started from the app (app/gui/server_control.py)
                 subscribes to the same loop.

This host is one subscriber of the loop: its on_step only appends the immutable EngineStepEvent to a
deque (appends are atomic), so a step never waits for the GUI. Every ~100 ms the engine thread also
appends `engine.memory()` and `engine.block_map()` snapshots to the same deque; the snapshot interval
stretches when a snapshot is expensive (thousands of blocks) so snapshots stay under ~5% of the engine's
time. The channel's items are typed (app/source/channel.py); the tokenizer never leaves the engine thread:
`submit_prompt` and `add_request` only check the request (engine/validation.py) and queue it, and the engine
thread renders the chat template and tokenizes.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace

from app.host import engine_work, lora_host
from app.host import host_commands as cmd
from app.load.generator import LoadConfig, LoadGenerator
from app.source import channel
from app.source.engine_info import EngineInfo, make_info
from app.source.notice import Notice
from app.tradeoff.roofline_feed import RoofProbe
from engine.config import EngineConfig
from engine.core.admission import RequestRejected
from engine.events import EngineStepEvent
from engine.serving.commands import Rebuild
from engine.serving.loop import EngineLoop, FailureKind, LoopFailure, Subscriber

SNAPSHOT_INTERVAL_S = 0.1
SNAPSHOT_MAX_SHARE = 0.05  # snapshots may take at most this share of the engine thread's time
MAX_EVENTS = 200_000  # the channel's cap if the GUI stops draining (oldest dropped)
PROMPT_TAIL_TOKENS = 24  # how much of a load-generator prompt its tab shows


class _HostSubscriber(Subscriber):
    def __init__(self, host: EngineHost) -> None:
        self.host = host

    def on_engine(self, engine) -> None:
        self.host._on_engine(engine)

    def on_step(self, event: EngineStepEvent) -> None:
        self.host._on_step(event)

    def on_error(self, failure: LoopFailure) -> None:
        self.host._on_failure(failure)


class EngineHost:
    name = "the embedded engine"

    def __init__(self, config: EngineConfig, *, engine=None, load_seed: int = 0) -> None:
        """engine: an already-loaded LLMEngine to host (benchmarks); else `config` is loaded in start()."""
        self.sigLoadProgress = Notice()  # (message, fraction), from the engine thread
        self.sigLoaded = Notice()  # (EngineInfo): loaded, and again after each rebuild
        self.sigLoadFailed = Notice()  # (message)
        self.config = config
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self._load_seed = load_seed
        self._events: deque = deque(maxlen=MAX_EVENTS)
        self.measurement_cancelled = threading.Event()
        self._ours: set[str] = set()  # the load generator's live request ids (engine thread only)
        self.loadgen: LoadGenerator | None = None
        self.snapshot_interval_s = SNAPSHOT_INTERVAL_S
        self._next_snapshot = 0.0
        self.perplexity: dict[int, float] = {}  # weight bits -> perplexity on the held-out text
        self.loop = EngineLoop(engine, config=config, progress=self.sigLoadProgress.emit, name="inferlab-engine")
        self.loop.subscribe(_HostSubscriber(self))
        self.loop.subscribe(RoofProbe(self.publish))  # the roofs, off the engine thread (after self's info)
        self.loop.add_ticker(self._tick)
        now = time.perf_counter
        for command_type, handler in {
            cmd.StartLoad: lambda c: self.loadgen.start(now()),
            cmd.StopLoad: lambda c: self.loadgen.stop(),
            cmd.Burst: lambda c: self.loadgen.burst(c.n, now()),
            cmd.SetLoadConfig: lambda c: self.loadgen.set_config(c.config, now()),
            cmd.SetArrivalRate: lambda c: self.loadgen.set_rate(c.rate, now()),
            cmd.SubmitArrivals: lambda c: [self.submit(a) for a in c.arrivals],
            cmd.Quantize: lambda c: engine_work.quantize(self, c.bits, c.group_size),
            cmd.AdoptPerplexity: lambda c: engine_work.adopt_perplexity(self, dict(c.by_bits)),
            cmd.Reset: lambda c: self._reset(),
            cmd.RunMeasurement: lambda c: c.job(self),
            cmd.UseLoras: lambda c: lora_host.use_loras(self, c),
            cmd.AskEveryAdapter: lambda c: lora_host.ask_every_adapter(self, c),
        }.items():
            self.loop.handle(command_type, handler)

    # --- lifecycle (GUI thread) -----------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop the engine thread; True when it ended within `timeout` (a model load cannot be cut short)."""
        return self.loop.stop(timeout)

    @property
    def engine(self):
        """The engine the loop runs now (engine-thread code and benchmarks; the GUI reads `info`)."""
        return self.loop.engine

    @property
    def _thread(self) -> threading.Thread | None:
        return self.loop.thread

    @property
    def loaded(self) -> bool:
        return self.info is not None

    def drain(self, limit: int | None = None) -> list:
        """Everything the engine thread published since the last call, oldest first (app/source/channel.py)."""
        return channel.drain(self._events, limit)

    # --- commands (any thread) --------------------------------------------------------------------
    def add_request(self, prompt, params, **kw) -> str:
        """Queue a request now (raises ValueError / RequestRejected / RuntimeError in the caller's thread)."""
        self._require_loaded()
        return self.loop.add_request(prompt, params, **kw)

    def submit_prompt(self, text: str, params, chat: bool) -> tuple[str, bool]:
        """A user's prompt, through the model's chat template when `chat` and it has one (rendered and
        tokenized in the engine thread, never here); returns (request id, whether the template applies)."""
        self._require_loaded()
        templated = chat and self.info.has_chat_template
        return self.loop.add_request(text, params, chat=templated), templated

    def abort(self, request_id: str) -> None:
        self._require_loaded()
        self.loop.abort(request_id)

    def reconfigure(self, **knobs) -> None:
        """Scheduling knobs (engine.RECONFIGURABLE); raises ValueError for a bad one."""
        self._require_loaded()
        self.loop.reconfigure(**knobs)

    def start_load(self) -> None:
        self.loop.post(cmd.StartLoad())

    def stop_load(self) -> None:
        self.loop.post(cmd.StopLoad())

    def burst(self, n: int) -> None:
        self.loop.post(cmd.Burst(int(n)))

    def submit_batch(self, arrivals: list) -> None:
        """Submit fixed Arrivals as load-generator requests, from the engine thread (benchmarks)."""
        self.loop.post(cmd.SubmitArrivals(tuple(arrivals)))

    def set_load_config(self, config: LoadConfig) -> None:
        self.loop.post(cmd.SetLoadConfig(config))

    def use_loras(self, mix: tuple[str, ...]) -> None:
        """Register the adapters of a preset's mix and run the load generator's requests with them."""
        self.loop.post(cmd.UseLoras(tuple(mix)))

    def ask_every_adapter(self, prompt: str, chat: bool = True) -> None:
        """One prompt to the base model and every adapter at once (a channel.SideBySide says which is which)."""
        self._require_loaded()
        self.loop.post(cmd.AskEveryAdapter(prompt, chat))

    def set_arrival_rate(self, rate: float) -> None:
        self.loop.post(cmd.SetArrivalRate(float(rate)))

    def reload(self, **config_changes) -> None:
        """Rebuild the engine with changed EngineConfig fields (e.g. the KV budget), in the engine
        thread, with progress; sigLoaded fires again when the new engine runs. Requests are aborted;
        every subscriber of the loop (the HTTP server too) follows the new engine."""
        self.info = None  # commands are refused ("still loading") until the new engine is up
        self.loop.post(Rebuild(dict(config_changes)))

    def quantize(self, bits: int, group_size: int | None = None) -> None:
        """Requantize the weights from the originals (engine thread, with channel.Busy progress), then
        measure perplexity on the held-out text for this and for 16 bits if not known yet."""
        self.loop.post(cmd.Quantize(int(bits), group_size))

    def adopt_perplexity(self, by_bits: dict[int, float]) -> None:
        """Take these perplexities (a sweep's, same held-out text and weights settings) as measured."""
        self.loop.post(cmd.AdoptPerplexity(tuple(sorted(by_bits.items()))))

    def reset(self) -> None:
        """Stop the load, abort every request; a channel.Reset follows their last events."""
        self.measurement_cancelled.set()
        self.loop.post(cmd.Reset())

    def run_measurement(self, job) -> None:
        """Run `job(host)` in the engine thread (a sweep, a comparison); the window keeps painting."""
        self.measurement_cancelled.clear()
        self.loop.post(cmd.RunMeasurement(job))

    def cancel_measurement(self) -> None:
        self.measurement_cancelled.set()

    def _require_loaded(self) -> None:
        if self.engine is None or self.info is None:
            raise RuntimeError("the model is still loading")

    # --- engine thread ----------------------------------------------------------------------------
    def publish(self, item) -> None:
        """Hand a typed item (app/source/channel.py) to the GUI."""
        self._events.append(item)

    def _on_engine(self, engine) -> None:
        """The first engine, or a rebuilt one: a fresh load generator (same settings), new info."""
        try:
            rebuilt = self.loadgen is not None
            if rebuilt:  # the adapters are the new engine's to register: the preset asks again (UseLoras)
                self.loadgen = LoadGenerator(replace(self.loadgen.config, lora_mix=()),
                                             corpus_ids=self.loadgen.corpus_ids, rng_seed=self._load_seed,
                                             max_model_len=engine.max_model_len,
                                             instructions=self.loadgen.instructions)
            else:
                self.loadgen = LoadGenerator(LoadConfig(), engine.tokenizer, self._load_seed,
                                             max_model_len=engine.max_model_len,
                                             instructions=lora_host.instruction_prompts(engine))
            self._ours.clear()
            info = make_info(engine, self.name)
        except Exception as exc:  # a bad model must not take the window down
            self._on_failure(LoopFailure(FailureKind.LOAD, f"{type(exc).__name__}: {exc}"))
            self.loop.stop()
            return
        if rebuilt:
            self.publish(channel.Reset())
        self.info = info
        self.sigLoaded.emit(info)

    def _on_failure(self, failure: LoopFailure) -> None:
        if failure.kind is FailureKind.LOAD:
            self.load_error = failure.message
            self.sigLoadFailed.emit(failure.message)
        else:
            self.publish(channel.Message(failure.message))

    def _on_step(self, event: EngineStepEvent) -> None:
        # runs inside engine.step(): keep it to a few appends
        self._events.append(event)
        for tl in event.finished:
            if tl.request_id in self._ours:
                self._ours.discard(tl.request_id)
                self.loadgen.on_finished(tl.request_id, tl.finished or 0.0)  # closed-loop users (issue 6)

    def _tick(self, now: float) -> float:
        """Before every step or wait: due arrivals, and snapshots when due. Returns when to tick next."""
        if self.loadgen is None:
            return now + SNAPSHOT_INTERVAL_S
        self.submit_due(now)
        if now >= self._next_snapshot:
            self._next_snapshot = self.take_snapshots()
        return min(self.loadgen.next_due(), self._next_snapshot)

    def take_snapshots(self) -> float:
        """Publish memory and block-map snapshots (and a compute line that changed); returns when the next
        one is due."""
        t0 = time.perf_counter()
        self._events.append(self.engine.memory())
        self._events.append(self.engine.block_map())
        self._publish_compute_change()
        cost = time.perf_counter() - t0
        return t0 + max(self.snapshot_interval_s, cost / SNAPSHOT_MAX_SHARE)

    def _publish_compute_change(self) -> None:
        """The kernels built in the background attach between two steps: the status bar follows."""
        info = self.info
        if info is None or not info.compute_short:
            return
        short = self.engine.compute_line(short=True)
        if short != info.compute_short:
            compute = self.engine.compute_line()
            self.info = replace(info, compute=compute, compute_short=short)  # a new frozen object, swapped whole
            self.publish(channel.ComputeChanged(compute, short))

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
            rid = self.engine.add_request(arrival.prompt_token_ids, SamplingParams(**arrival.sampling),
                                          lora_name=arrival.lora_name)
        except ValueError as exc:
            self.publish(channel.Message(f"load generator request refused: {exc}"))
            self.loadgen.on_submitted(None, arrival, now)
            return False
        except RequestRejected:  # admission control: the timeline marks it
            self.loadgen.on_submitted(None, arrival, now)
            return False
        self.loadgen.on_submitted(rid, arrival, now)
        self._ours.add(rid)
        self.publish(channel.LoadStream(rid, arrival.kind, self._prompt_tail(arrival.prompt_token_ids),
                                        arrival.lora_name))
        return True

    def _prompt_tail(self, prompt_ids) -> str | None:
        """The end of a load-generator prompt, as text for its tab (decoded here, not in the GUI)."""
        if not prompt_ids:
            return None
        tail = prompt_ids[-PROMPT_TAIL_TOKENS:]
        text = self.engine.tokenizer.decode(tail).replace("\n", " ").strip()
        return ("… " if len(prompt_ids) > len(tail) else "") + text + f"   [{len(prompt_ids)} prompt tokens]"

    def _reset(self) -> None:
        self.loadgen.clear()
        self.abort_all()
        self.publish(channel.Reset())

    def abort_all(self, only_ours: bool = False) -> None:
        """Abort every live request (or only the load generator's) and step until they are gone."""
        self.loop.abort_all(set(self._ours) if only_ours else None)

    @property
    def stopping(self) -> bool:
        return self.loop.stopping

    @property
    def live_request_ids(self) -> frozenset[str]:
        return self.loop.live_request_ids
