"""MainWindow: every panel in a dock, the caption on top, load progress in the status bar.

The window only arranges things; AppController (app/gui/controller.py) decides what a click means,
PanelFeeder (app/gui/panel_feeder.py) moves the engine source's channel items into panels on a ~30 Hz timer.
The window talks to its engine source (app/source/engine_source.py; EngineHost today) through that interface
only: its signals, `info` and `drain()`; never the engine inside it.
"""
from __future__ import annotations

import math
import sys

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMainWindow,
    QProgressBar,
    QSizePolicy,
    QToolBar,
)

from app.gui import collector
from app.gui.controller import AppController
from app.gui.frame_governor import FrameGovernor
from app.gui.panel_feeder import PanelFeeder
from app.gui.panels import make_panels
from app.gui.presenter_mode import PresenterMode
from app.gui.server_control import ServerControl
from app.gui.source_signals import SourceSignals
from app.gui.trace_recorder import TraceRecorder
from app.gui.tune_actions import TuneActions
from app.gui.window_docks import build_docks, hide_stale_tab_bars, size_compact
from app.gui.window_fit import COMPACT_HEIGHT, DEFAULT_SIZE, available_size, fitted, keep_on_screen, layout_key
from app.gui.window_menus import build_menus
from app.source.engine_source import EngineSource
from app.talk.panel_specs import PANEL_BY_NAME, PANEL_SPECS
from app.tradeoff.tradeoff_meter import TradeoffMeter
from engine.events import KvCacheDtype
from widgets import CaptionBanner, apply_theme

DRAIN_INTERVAL_MS = 33  # ~30 Hz
DRAIN_LIMIT = 5000  # events per tick, so a backlog never blocks the event loop for long
# the saved dock layout's version: a layout saved before a dock was added is not restored over the new window
# (2: the comparison and roofline docks; 3: the server dock; 4: the LoRA dock); a new panel bumps it
STATE_VERSION = len(PANEL_SPECS) - 8


class MainWindow(QMainWindow):
    def __init__(self, host: EngineSource, settings: QSettings | None = None, *, persist: bool = True,
                 tradeoff_seconds: float = 5.0, screen_size: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.setWindowTitle("inferlab")
        self.setObjectName("inferlab-main")
        self.host = host
        self._kv_blocks_shown = 0  # the KV block count the status bar shows (it changes with requantization)
        collector.acquire()
        self._gc_held = True
        self.settings = settings
        self.persist = persist and settings is not None
        self.panels = make_panels()
        self.caption = CaptionBanner()
        self.recorder = TraceRecorder()
        self.meter = TradeoffMeter(min_seconds=tradeoff_seconds)
        self.feeder = PanelFeeder(self.panels, self.meter, self.recorder, self)
        self.controller = AppController(self, host, self.panels, self.feeder, self.meter, self.caption)
        self.server = ServerControl(host)
        self.tuning = TuneActions(self)  # File → Tune a server…: sweeps of managed servers
        self._emphasised: tuple[str, ...] = ()
        self._sized_once = self._restored_layout = False
        self.room = available_size(self, screen_size)  # the screen's available size (or the one given)
        self.compact = self.room[1] < COMPACT_HEIGHT  # a laptop or a projector: the compact arrangement
        self.docks = build_docks(self, self.panels, compact=self.compact)
        self.panels.comparison.set_compact(self.compact)
        self.caption.set_compact(self.compact)
        self._build_caption_bar()
        self._build_status_bar()
        theme = self._setting("theme", "dark")
        self.theme = theme if theme in ("dark", "light") else "dark"  # an edited settings file: the default
        self.actions_by_name = build_menus(self)
        self._drain_timer = QTimer(self)
        self._drain_timer.setInterval(DRAIN_INTERVAL_MS)
        self._drain_timer.timeout.connect(self._on_drain)
        self._drain_timer.start()
        self.governor = FrameGovernor(self.panels.values(), self)
        self.governor.sigRateChanged.connect(self._on_frame_rate)
        self.source_signals = SourceSignals(host)  # the source's load notices, delivered in this thread
        self.source_signals.sigLoadProgress.connect(self._on_load_progress)
        self.source_signals.sigLoaded.connect(self._on_loaded)
        self.source_signals.sigLoadFailed.connect(self._on_load_failed)
        self.feeder.sigQuantized.connect(self._on_quantized)
        self.feeder.sigComputeChanged.connect(self._on_compute_changed)
        self.feeder.sigMessage.connect(self.show_message)
        self.feeder.sigServerStatus.connect(self._on_server_status)
        self.presenting = PresenterMode(self, STATE_VERSION)
        self.attached_windows: list[MainWindow] = []  # File → Attach to server… opens these
        self.resize(*fitted(DEFAULT_SIZE, self.room))
        if self.compact:
            size_compact(self, self.docks)
        self.default_state = self.saveState(STATE_VERSION)  # presenter mode arranges from it
        self.set_theme(self.theme)
        if self.persist:
            self._restore_settings()

    # --- construction -------------------------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        keep_on_screen(self, self.room)  # a restored geometry from another screen, or a minimum that grew
        if self.compact and not self._sized_once:  # the columns' shares need the shown window's layout
            self._sized_once = True
            QTimer.singleShot(0, self._size_compact_columns)

    def _size_compact_columns(self) -> None:
        """Once shown: the compact columns' shares; the layout "Reset layout" and presenter mode start from."""
        restored = self.saveState(STATE_VERSION)
        size_compact(self, self.docks)
        self.default_state = self.saveState(STATE_VERSION)
        if self._restored_layout and not self.presenter:  # the user's own layout for this screen size
            self.restoreState(restored, STATE_VERSION)
        QTimer.singleShot(0, lambda: hide_stale_tab_bars(self))

    def _build_caption_bar(self) -> None:
        bar = QToolBar("Caption", self)
        bar.setObjectName("caption-bar")
        bar.setMovable(False)
        self.caption.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        bar.addWidget(self.caption)
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, bar)
        self.caption_bar = bar

    def _build_status_bar(self) -> None:
        self.status_label = QLabel("starting…")
        self.status_label.setWordWrap(True)  # a long message takes a second line, not the window's width
        self.engine_label = QLabel()
        self.rate_label = QLabel("panels 20 Hz")
        self.rate_label.setToolTip("How often the panels repaint: slowed while the GUI thread's CPU time would "
                                   "slow the engine (they share Python's GIL)")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(260)
        self.progress.setRange(0, 1000)
        sb = self.statusBar()
        sb.addWidget(self.status_label, 1)
        sb.addPermanentWidget(self.rate_label)
        sb.addPermanentWidget(self.engine_label)
        sb.addPermanentWidget(self.progress)

    # --- engine host signals ------------------------------------------------------------------
    def _on_load_progress(self, message: str, fraction: float) -> None:
        self.progress.show()
        self.progress.setValue(round(1000 * max(0.0, min(1.0, fraction))))
        self.progress.setFormat(f"{message} %p%")
        self.status_label.setText(f"loading {self.host.config.model}: {message}")

    def _on_loaded(self, info) -> None:
        collector.collect_and_freeze()
        self.progress.hide()
        self._show_engine_label(info.num_kv_blocks)
        attached = info.capabilities.client_timings
        self.show_message(f"attached to {info.source}: model {info.model}" if attached
                          else f"model loaded: {info.model_path}" + (f" · {info.compute}" if info.compute else ""))
        self.controller.on_loaded(info)

    def _show_engine_label(self, num_kv_blocks: int) -> None:
        self._kv_blocks_shown = num_kv_blocks
        info = self.host.info
        if info.capabilities.server_metrics or info.capabilities.client_timings:
            state = getattr(self.host, "status", ("connected", ""))[0]
            self.engine_label.setText(f"{info.model} · {info.source} · {state}")
            return
        kv = " (int8)" if info.config.get("kv_cache_dtype") == KvCacheDtype.INT8 else ""
        compute = f" · {info.compute_short}" if info.compute_short else ""  # compute path, threads; why: tooltip
        self.engine_label.setToolTip(info.compute)
        if self.compact:  # the status bar's width is the window's least width: the short form on a small screen
            self.engine_label.setText(f"{info.model} · {info.device} · {num_kv_blocks} KV blocks{kv}{compute}")
            return
        self.engine_label.setText(f"{info.model} · {info.device} · {info.dtype} · {num_kv_blocks} KV blocks{kv} "
                                  f"× {info.block_size} · context {info.max_model_len}{compute}")

    def _on_compute_changed(self, compute: str) -> None:
        """The native kernels built in the background took over (or failed): the status bar says so."""
        info = self.host.info
        if info is not None:
            self._show_engine_label(self._kv_blocks_shown or info.num_kv_blocks)
        self.show_message(f"compute now: {compute}")

    def _on_quantized(self, _bits: int, num_kv_blocks: int) -> None:
        """Requantizing resized the KV cache (the bytes the weights freed or took back)."""
        if self.host.info is not None:
            self._show_engine_label(num_kv_blocks)

    def _on_server_status(self, state: str, text: str) -> None:
        """An attached server's connection changed: the status bar says so until it changes again."""
        info = self.host.info
        if info is not None:
            self.engine_label.setText(f"{info.model} · {info.source} · {state}")
        else:
            self.status_label.setText(text)
        self.show_message(text)

    def _on_load_failed(self, message: str) -> None:
        self.progress.hide()
        self.engine_label.setText("no model")
        self.controller.on_load_failed(message)

    def _on_frame_rate(self, hz: float) -> None:
        self.rate_label.setText(f"panels {hz:.0f} Hz")
        self._drain_timer.setInterval(max(DRAIN_INTERVAL_MS, round(500 / hz)))  # twice per repaint

    def _on_drain(self) -> None:
        items = self.host.drain(DRAIN_LIMIT)
        if items:
            self.feeder.feed(items)

    # --- window-level state -------------------------------------------------------------------
    def show_message(self, text: str) -> None:
        self.status_label.setText(text)

    def set_theme(self, name: str) -> None:
        app = QApplication.instance()
        apply_theme(app, name if name in ("dark", "light") else "dark")
        self.theme = name
        if self.persist:
            self.settings.setValue("theme", name)
        for n, action in getattr(self, "actions_by_name", {}).items():
            if n in ("theme-dark", "theme-light"):
                action.setChecked(n == f"theme-{name}")

    def set_presenter(self, on: bool, full_screen: bool = True, screen_height: int | None = None) -> None:
        """Presenter mode (app/gui/presenter_mode.py); full screen unless `full_screen` is False."""
        self.presenting.set(on, full_screen, screen_height)
        if "presenter" in self.actions_by_name:
            self.actions_by_name["presenter"].setChecked(on)

    @property
    def presenter(self) -> bool:
        return self.presenting.on

    def emphasise(self, names) -> None:
        """Show and raise the preset's panels; mark them with a star in their title."""
        self._emphasised = tuple(names)
        for name, dock in self.docks.items():
            dock.setWindowTitle(("★ " if name in names else "") + PANEL_BY_NAME[name].title)
        for name in reversed(self._emphasised):  # the first named ends on top of a tab group
            self.docks[name].show()
            self.docks[name].raise_()
        self.presenting.show_panels(self._emphasised)

    def reset_layout(self) -> None:
        self.restoreState(self.default_state, STATE_VERSION)
        for dock in self.docks.values():
            dock.show()

    def flush_panels(self) -> None:
        self.feeder.flush_pending()
        for panel in self.panels.values():
            if hasattr(panel, "flush"):
                panel.flush()

    # --- settings -----------------------------------------------------------------------------
    def _setting(self, key: str, default):
        if self.settings is None or not self.persist:
            return default
        return self.settings.value(key, default)

    def _restore_settings(self) -> None:
        """The layout and the GPU-hour price kept from the last run. A value of the wrong kind (a settings
        file edited by hand, or damaged) is left out and named in the status bar: the window still opens,
        with the default in its place (it used to stop the app at launch, every time)."""
        ignored = []
        for key, restore in (("geometry", self.restoreGeometry),
                             ("windowState", lambda state: self.restoreState(state, STATE_VERSION))):
            # this screen size's layout; the one saved before layouts were kept per size only where it fits
            value = self.settings.value(f"{layout_key(self.room)}/{key}")
            if value is None and not self.compact:
                value = self.settings.value(key)
            if value is None:
                continue
            if isinstance(value, (QByteArray, bytes, bytearray)):
                restore(value)
                self._restored_layout = True
            else:
                ignored.append(key)
        price = self.settings.value("price_per_hour")
        if price is not None:
            try:
                value = float(price)
            except (TypeError, ValueError):
                value = math.nan
            if math.isfinite(value) and value >= 0:
                self.panels.tradeoff.set_price_per_hour(value)
            else:
                ignored.append(f"price_per_hour={price!r}")
        if ignored:  # the status bar soon shows the preset's line: said on the terminal too
            text = (f"settings: left out {', '.join(ignored)} (not a value this window can use); defaults instead "
                    f"({self.settings.fileName()})")
            self.show_message(text)
            print(f"inferlab: {text}", file=sys.stderr)

    def save_settings(self) -> None:
        if not self.persist:
            return
        self.settings.setValue(f"{layout_key(self.room)}/geometry", self.saveGeometry())
        self.settings.setValue(f"{layout_key(self.room)}/windowState", self.saveState(STATE_VERSION))
        self.settings.setValue("theme", self.theme)
        self.settings.setValue("price_per_hour", self.panels.tradeoff.price_per_hour())
        if self.controller.preset is not None:
            self.settings.setValue("last_preset", self.controller.preset.path)
        self.settings.sync()

    def attach(self, url: str, api_key: str | None = None):
        """Open a second window fed by an OpenAI-compatible server (app/remote/source.py), with this
        window's preset; None (and a message) for a URL that is not one."""
        from app.remote.source import RemoteSource

        try:
            source = RemoteSource(url, api_key)
        except ValueError as exc:
            self.show_message(f"not attached: {exc}")
            return None
        self.show_message(f"attaching to {source.url} in a new window")
        return self.open_source_window(source)

    def open_source_window(self, source: EngineSource):
        """A second window fed by `source` (an attached or a managed server), with this window's preset."""
        window = MainWindow(source, self.settings, persist=False)
        window.controller.interactive = self.controller.interactive
        self.attached_windows.append(window)
        window.show()
        source.start()
        if self.controller.preset is not None:
            window.controller.apply_preset(self.controller.preset.path)
        return window

    def toggle_server(self, on: bool) -> None:
        """Serve the OpenAI-compatible API on this window's engine: external requests show in the panels."""
        if not on:
            self.server.stop()
            self.show_message("OpenAI-compatible server stopped")
            return
        info = self.host.info
        if info is not None and not info.capabilities.serve:
            self.actions_by_name["serve"].setChecked(False)
            self.show_message(f"server not started: serving the API is not offered by {info.source}")
            return
        try:
            url = self.server.start()
        except (RuntimeError, OSError) as exc:
            self.actions_by_name["serve"].setChecked(False)
            self.show_message(f"server not started: {exc}")
            return
        self.show_message(f"serving the OpenAI-compatible API at {url}; its requests show in the panels")

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self.server.stop()
        self.tuning.shutdown()
        if self.presenter:
            self.set_presenter(False)
        self.save_settings()
        self._drain_timer.stop()
        self.governor.stop()
        self.controller.shutdown()
        if not self.host.shutdown(timeout=5.0):
            self.show_message("the engine thread did not stop within 5 s (a model load cannot be interrupted)")
        if self._gc_held:
            self._gc_held = False
            collector.release()
        super().closeEvent(event)
