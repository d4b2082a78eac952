"""PanelFeeder: the GUI-thread consumer of the engine source's channel. It only hands data to panels.

Drained ~30 times a second; each item is dispatched by its type (the table in __init__; the item types
are in app/source/channel.py plus the engine's EngineStepEvent, MemorySnapshot and BlockMapSnapshot). Step
events feed the token streams and the tradeoff meter at once, the timeline/Gantt (10 Hz) and the latency
panel (4 Hz) in batches; memory and block-map snapshots feed the memory panel (the latest one only);
load-generator arrivals open token-stream tabs, up to a cap, replacing the oldest finished tab.
Per-stream TTFT and tokens/s come with the engine's RequestOutputs; nothing is recomputed here.
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.gui.panels import Panels
from app.gui.trace_recorder import TraceRecorder
from app.source import channel
from app.tradeoff.roofline_feed import RooflineFeed
from app.tradeoff.tradeoff_meter import TradeoffMeter
from engine.events import BlockMapSnapshot, EngineStepEvent, MemorySnapshot
from widgets.lora_panel import AdapterRow

TIMELINE_EVERY_S = 0.1  # 10 Hz: the timeline scrolls smoothly enough
LATENCY_EVERY_S = 0.25  # histograms change only when requests finish
MEMORY_EVERY_S = 0.2  # the block map and memory bar
MAX_LOAD_TABS = 8  # load-generator streams shown at once
MAX_USER_TABS = 4
MIN_TAB_INTERVAL_S = 0.5


@dataclass(slots=True)
class _Shown:
    """A stream on show: the engine's latest figures for it, and whether its tab needs them."""

    ttft_s: float | None = None
    tokens_per_s: float | None = None
    finished: bool = False
    dirty: bool = False


class PanelFeeder(QObject):
    sigSweepProgress = Signal(str, float)  # text ("" when done), fraction
    sigMessage = Signal(str)  # errors and notes for the status bar
    sigReset = Signal()  # the engine finished a reset: panels were cleared
    sigComparison = Signal(str, object)  # preset name, its measured comparison (app/talk/compare_run.py)
    sigBusy = Signal(str, object)  # background work in the engine thread: text ("" when done), fraction
    sigQuantized = Signal(int, int)  # the weights now have this many bits; the KV cache this many blocks
    sigComputeChanged = Signal(str)  # the engine's compute line, new (the native kernels took over)
    sigServerStatus = Signal(str, str)  # an attached server's connection: state, text
    sigServerRestarted = Signal(object)  # a managed server's restart ended (channel.ServerRestarted)

    def __init__(self, panels: Panels, meter: TradeoffMeter, recorder: TraceRecorder, parent=None) -> None:
        super().__init__(parent)
        self.panels = panels
        self.meter = meter
        self.recorder = recorder
        self._streams: OrderedDict[str, _Shown] = OrderedDict()  # shown streams, oldest first
        self._user: set[str] = set()
        self._followed: str | None = None  # the stream we switched to last
        self._timeline_pending: list[EngineStepEvent] = []
        self._latency_pending: list[EngineStepEvent] = []
        self._timeline_fed = self._latency_fed = self._memory_fed = 0.0
        self._memory = self._blocks = None  # the latest snapshots not yet shown
        self.num_steps = 0
        self.step_listeners: list = []  # called with each step's stats (the controller's live scale)
        self._last_tab = 0.0
        self._points: dict = {}  # tradeoff label -> latest measured point
        self.roofline = RooflineFeed(panels.roofline)
        self._handlers = {  # channel item type -> handler
            EngineStepEvent: self._on_step,
            MemorySnapshot: self._on_memory,
            BlockMapSnapshot: self._on_blocks,
            channel.LoadStream: self._add_load_stream,
            channel.Reset: self._on_reset,
            channel.SweepProgress: lambda p: self.sigSweepProgress.emit(p.text, p.fraction),
            channel.SweepPoint: lambda p: self.panels.tradeoff.add_sweep_point(p.point),
            channel.SweepDone: self._on_sweep_done,
            channel.ComparisonResult: lambda c: self.sigComparison.emit(c.preset, c.result),
            channel.RooflineAtLoad: lambda r: self.roofline.on_loaded(r.payload, self.panels.tradeoff),
            channel.Message: lambda m: self.sigMessage.emit(m.text),
            channel.Busy: lambda b: self.sigBusy.emit(b.text, b.fraction),
            # kept across resets and rebuilds: the weights keep their bits
            channel.QuantError: lambda q: self.panels.quant.set_report(q.bits, dict(q.errors)),
            channel.Quantized: lambda q: self.sigQuantized.emit(q.bits, q.num_kv_blocks),
            channel.ComputeChanged: lambda c: self.sigComputeChanged.emit(c.compute),
            channel.Perplexity: self._on_perplexity,
            channel.LoraAdapters: lambda a: self.panels.lora.set_adapters([AdapterRow(**r) for r in a.adapters]),
            channel.SideBySide: lambda s: self.panels.lora.begin_side_by_side(dict(s.assignments)),
            # an attached server (app/remote/source.py): its /metrics, and its streams as the client timed them
            channel.ServerSample: self._on_server_sample,
            channel.ServerStatus: self._on_server_status,
            channel.ClientSent: lambda c: self.panels.timeline.request_arrived(c.request_id, c.t),
            channel.ClientOutput: self._on_client_output,
            channel.ClientFinished: self._on_client_finished,
            channel.ServerRestarted: self.sigServerRestarted.emit,
        }

    # --- streams ------------------------------------------------------------------------------
    def add_user_stream(self, request_id: str, title: str, prompt: str) -> None:
        users = [r for r in self._streams if r in self._user]
        if len(users) >= MAX_USER_TABS:
            self._drop(users[0])
        self._user.add(request_id)
        self._streams[request_id] = _Shown()
        self._followed = request_id
        self.panels.tokens.add_stream(request_id, title, prompt)

    def _add_load_stream(self, item: channel.LoadStream) -> None:
        request_id = item.request_id
        now = time.perf_counter()
        if now - self._last_tab < MIN_TAB_INTERVAL_S:
            return  # heavy traffic: a new tab (a text view) at most every MIN_TAB_INTERVAL_S
        shown = [r for r in self._streams if r not in self._user]
        if len(shown) >= MAX_LOAD_TABS:
            done = [r for r in shown if self._streams[r].finished]
            if not done:
                return  # every tab is still streaming: this one is not shown
            self._drop(done[0])
        self._last_tab = now
        self._streams[request_id] = _Shown()
        # switch to the newest stream only once the one on show has finished (never away from the user's)
        followed = self._streams.get(self._followed) if self._followed else None
        activate = followed is None or (followed.finished and self._followed not in self._user)
        if activate:
            self._followed = request_id
        self.panels.tokens.add_stream(request_id, f"{request_id} ({item.kind})", item.prompt_tail,
                                         activate=activate, adapter=item.lora_name)

    def _drop(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._user.discard(request_id)
        self.panels.tokens.remove_stream(request_id)

    # --- the drain ----------------------------------------------------------------------------
    def feed(self, items: list) -> None:
        handlers = self._handlers
        for item in items:
            handler = handlers.get(type(item))
            if handler is None:  # a source published something no panel knows: say so, drop it
                self.sigMessage.emit(f"no panel shows {type(item).__name__} items")
                continue
            handler(item)
        self._feed_plots()
        self._feed_memory()
        self._push_timings()

    def _on_memory(self, snap: MemorySnapshot) -> None:
        self._memory = snap

    def _on_blocks(self, snap: BlockMapSnapshot) -> None:
        self._blocks = snap

    def _on_reset(self, _item: channel.Reset) -> None:
        self._memory = self._blocks = None
        self.clear()
        self.sigReset.emit()

    def _on_sweep_done(self, done: channel.SweepDone) -> None:
        if done.result:
            self.panels.tradeoff.set_sweep(done.result)
        self.sigSweepProgress.emit("", 1.0)

    def _on_perplexity(self, item: channel.Perplexity) -> None:
        self.meter.perplexity.update(item.by_bits)
        self.sigMessage.emit("perplexity on the held-out text: " + ", ".join(
            f"{bits}-bit {ppl:.3f}" for bits, ppl in sorted(item.by_bits.items(), reverse=True)))

    def _on_step(self, event: EngineStepEvent) -> None:
        self.num_steps += 1
        for listener in self.step_listeners:  # the live load's scale (app/gui/live_scale.py)
            listener(event.stats)
        tokens = self.panels.tokens
        self.recorder.add(event)
        self.roofline.add(event.stats)
        self._timeline_pending.append(event)
        self._latency_pending.append(event)
        lora = self.panels.lora
        if event.lora_pool is not None or event.lora_events:
            lora.add_step(event.stats, event.lora_events, event.lora_pool)
        for out in event.outputs:
            if lora.wants(out.request_id):
                lora.append_answer(out.request_id, out.new_text)
            shown = self._streams.get(out.request_id)
            if shown is None:
                continue
            tokens.append_output(out)
            shown.ttft_s, shown.tokens_per_s = out.ttft_s, out.tokens_per_s  # the engine's figures
            shown.finished = shown.finished or out.finished
            shown.dirty = True
        if event.spec is not None:
            self.panels.spec.add_spec_stats(event.spec)
        point = self.meter.add(event)
        if point is not None:
            self.panels.tradeoff.add_point(point)
            self.panels.tradeoff.set_current(point.label)
            self._points[point.label] = point
            self._update_measured_speedup(point)

    def _on_server_sample(self, sample: channel.ServerSample) -> None:
        facts = sample.facts
        self.panels.server.set_facts(facts_dict(facts))
        if "generated tokens/s" not in facts.not_exposed:  # the server's count, not this client's
            self.panels.latency.set_server_tokens_per_s(facts.generation_tokens_per_s, facts.server_name)

    def _on_server_status(self, status: channel.ServerStatus) -> None:
        self.panels.server.set_status(status.state, status.text)
        self.sigServerStatus.emit(status.state, status.text)

    def _on_client_output(self, item: channel.ClientOutput) -> None:
        out = item.output
        shown = self._streams.get(out.request_id)
        if shown is not None:
            self.panels.tokens.append_output(out)
            shown.ttft_s, shown.tokens_per_s = out.ttft_s, out.tokens_per_s  # measured on arrival
            shown.finished = shown.finished or out.finished
            shown.dirty = True
        if item.num_tokens:
            self.panels.latency.add_tokens(item.t, item.t, item.num_tokens)
            self.panels.timeline.request_span(out.request_id, item.t, item.t, "decode")

    def _on_client_finished(self, item: channel.ClientFinished) -> None:
        tl = item.timeline
        self.panels.timeline.request_finished(tl.request_id, tl.finished, tl.finish_reason)
        self.panels.latency.add_finished(tl)
        self.panels.server.add_client_timings(tl.ttft, tl.e2e if tl.first_token is not None else None,
                                                 item.inter_token_s)
        if item.error and tl.request_id in self._user:
            self.sigMessage.emit(f"{tl.request_id}: {item.error}")

    def flush_pending(self) -> None:
        """Hand every batched event to the plot panels now (screenshots, exports, tests)."""
        self._feed_plots(force=True)
        self._feed_memory(force=True)

    def _feed_memory(self, force: bool = False) -> None:
        now = time.perf_counter()
        if (self._memory or self._blocks) and (force or now - self._memory_fed >= MEMORY_EVERY_S):
            self._memory_fed = now
            if self._memory is not None:
                self.panels.memory.set_memory(self._memory)
            if self._blocks is not None:
                self.panels.memory.set_block_map(self._blocks)
            self._memory = self._blocks = None

    def _update_measured_speedup(self, point) -> None:
        """Speculation's measured speed-up: tokens/s per user of this configuration over the same
        configuration with draft length 0, when both have run (under their own load, in this session)."""
        k = point.config.get("num_speculative_tokens", 0)
        if not k:
            return
        plain = {**point.config, "num_speculative_tokens": 0}
        base = next((p for p in self._points.values() if p.config == plain), None)
        if base is not None and base.tokens_per_s_per_user > 0:
            self.panels.spec.set_measured_speedup(point.tokens_per_s_per_user / base.tokens_per_s_per_user)

    def _feed_plots(self, force: bool = False) -> None:
        """The plot panels get their events in batches (TIMELINE_EVERY_S, LATENCY_EVERY_S): a panel
        repaints only when fed, and a pyqtgraph repaint costs milliseconds; the text streams stay live."""
        now = time.perf_counter()
        if self._timeline_pending and (force or now - self._timeline_fed >= TIMELINE_EVERY_S):
            self._timeline_fed = now
            timeline = self.panels.timeline
            for event in self._timeline_pending:
                for rid, t_arrival, _n in event.arrived:
                    timeline.request_arrived(rid, t_arrival)
                timeline.add_step(event.stats)
                t_end = event.stats.t_start + event.stats.wall_time_s
                for tl in event.finished:
                    timeline.request_finished(tl.request_id, tl.finished if tl.finished is not None else t_end,
                                              tl.finish_reason)
            self._timeline_pending.clear()
        if self._latency_pending and (force or now - self._latency_fed >= LATENCY_EVERY_S):
            self._latency_fed = now
            latency = self.panels.latency
            for event in self._latency_pending:
                latency.add_step(event.stats)
                for tl in event.finished:
                    latency.add_finished(tl)
            self._latency_pending.clear()

    def _push_timings(self) -> None:
        tokens = self.panels.tokens
        for rid, shown in self._streams.items():
            if shown.dirty:
                shown.dirty = False
                tokens.set_stream_timing(rid, shown.ttft_s, shown.tokens_per_s)

    def clear(self) -> None:
        """Empty every data panel (not the controls, not the tradeoff points: they are history; not the
        quantization error: the weights keep their bits through a reset or a rebuild)."""
        p = self.panels
        for panel in (p.tokens, p.memory, p.timeline, p.latency, p.spec, p.lora, p.server):
            panel.reset()
        self._streams.clear()
        self._user.clear()
        self._followed = None
        self._timeline_pending.clear()
        self._latency_pending.clear()
        self.meter.restart()
        self.recorder.clear()


def facts_dict(facts) -> dict:
    """An attached server's ServerFacts as the plain dict the Server panel shows."""
    d = dataclasses.asdict(facts)
    d["server_name"] = facts.server_name
    return d
