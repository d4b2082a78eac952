"""Recording and replaying in the window: File → Record (a red dot and the file's size on the status bar
while it records), a recording played in this window (dropped onto it, or a chapter's run recorded by
`prepare`, played on stage when the live run cannot hold: P), and back to the live source.

The window drains `source`: the live host, or the recording playing in its place. A ReplaySource that is
the window's own host (`inferlab --replay FILE`) is followed by the replay bar from the start.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtWidgets import QFileDialog, QLabel

from app.gui.availability import grey_out_features
from app.gui.replay_bar import ReplayBar
from app.gui.source_signals import SourceSignals
from app.record.reader import RecordingError
from app.record.tap import ChannelRecorder
from app.record.writer import DEFAULT_MAX_BYTES, SUFFIX
from app.replay.source import ReplaySource


def _size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.0f} kB"


class RecordingActions(QObject):
    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.recorder: ChannelRecorder | None = None
        self.playing: ReplaySource | None = None
        self._playing_signals: SourceSignals | None = None  # its load notices, delivered in the GUI thread
        self.chapter_note = ""
        self.max_bytes = DEFAULT_MAX_BYTES
        self._pending: str | None = None  # --record before the source has loaded
        self.label = QLabel("")
        self.label.setStyleSheet("color: #e5484d; font-weight: bold")
        self.label.hide()
        window.statusBar().addPermanentWidget(self.label)
        self.bar = ReplayBar(window)
        window.addToolBar(Qt.ToolBarArea.BottomToolBarArea, self.bar)
        self.bar.follow(window.host if isinstance(window.host, ReplaySource) else None)
        self._timer = QTimer(self)
        self._timer.setInterval(1000)
        self._timer.timeout.connect(self._show_size)
        window.feeder.taps.append(self._tap)
        window.source_signals.sigLoaded.connect(self._on_host_loaded)  # before the window's own slot

    @property
    def source(self):
        """What the panels are fed from now."""
        return self.playing or self.window.host

    # --- File → Record --------------------------------------------------------------------------------
    def start(self, path: str | Path, max_bytes: int | None = None) -> str | None:
        """Record what the panels get into `path` (from when the source has loaded); an error line, or None."""
        self.max_bytes = max_bytes or self.max_bytes
        if self.recorder is not None:
            return f"already recording to {self.recorder.path}"
        info = self.window.host.info
        if info is None:
            self._pending = str(path)
            self.window.show_message(f"recording to {path} once {self.window.host.name} has loaded")
            return None
        ctl = self.window.controller
        try:
            self.recorder = ChannelRecorder(path, info, what=f"the app ({self.window.host.name})",
                                            knobs=self._knobs(), max_bytes=self.max_bytes,
                                            preset=ctl.preset.name if ctl.preset is not None else None)
        except (OSError, ValueError) as exc:
            self.window.show_message(f"not recording: {exc}")
            return str(exc)
        self._set_checked(True)
        self.label.show()
        self._show_size()
        self._timer.start()
        self.window.show_message(f"recording to {path} (at most {self.max_bytes / 2**20:.0f} MB)")
        return None

    def stop(self) -> Path | None:
        self._pending = None
        recorder, self.recorder = self.recorder, None
        self._timer.stop()
        self.label.hide()
        self._set_checked(False)
        if recorder is None:
            return None
        recorder.close()
        self.window.show_message(f"recording saved: {recorder.path} ({_size_text(recorder.size)}); "
                                 f"`inferlab --replay {recorder.path}` plays it")
        return recorder.path

    def toggle(self, on: bool) -> None:
        if not on:
            self.stop()
            return
        path, _ = QFileDialog.getSaveFileName(self.window, "Record to", str(Path.home() / f"run{SUFFIX}"),
                                              f"inferlab recording (*{SUFFIX})")
        if not path or self.start(path) is not None:
            self._set_checked(False)

    def _set_checked(self, on: bool) -> None:
        action = self.window.actions_by_name.get("record") if hasattr(self.window, "actions_by_name") else None
        if action is not None:
            action.setChecked(on)

    def _knobs(self) -> dict:
        ctl = self.window.controller
        return {**ctl.config, "arrival_rate": ctl.state.arrival_rate}

    def _tap(self, items: list) -> None:
        if self.recorder is None:
            return
        self.recorder.add(items)
        self.recorder.knobs(self._knobs())
        if self.recorder.stopped:
            why = self.recorder.stopped
            self.stop()
            self.window.show_message(f"recording stopped: {why}")

    def _show_size(self) -> None:
        if self.recorder is not None:
            self.label.setText(f"● REC {_size_text(self.recorder.size)}")
            self.label.setToolTip(f"recording to {self.recorder.path} (File → Record to stop)")

    def _emphasise_recorded(self, source: ReplaySource) -> None:
        """The panels a recording says tell its story (the GPU check's: memory, timeline, acceptance)."""
        from app.talk.panel_specs import PANEL_NAMES

        names = source.header.get("panels")
        if isinstance(names, list) and names and all(n in PANEL_NAMES for n in names):
            self.window.emphasise(tuple(names))

    def _on_host_loaded(self, info) -> None:
        if isinstance(self.window.host, ReplaySource):  # inferlab --replay: the whole window is a recording
            self._emphasise_recorded(self.window.host)
            self.window.panels.comparison.set_panels_note(
                f"the panels: a recorded run ({self.window.host.recorded_on}), not live")
        if self.recorder is not None:
            self.recorder.add_info(info)  # a rebuilt engine: its new info
        elif self._pending is not None:
            path, self._pending = self._pending, None
            QTimer.singleShot(0, lambda: self.start(path))

    # --- a recording played in this window ------------------------------------------------------------------
    def play(self, path: str | Path, chapter_note: str = "") -> bool:
        """Feed the panels from the recording at `path` instead of the live source (whose load stops)."""
        w = self.window
        try:
            source = ReplaySource(path)
        except (OSError, RecordingError) as exc:
            w.show_message(f"not played: {exc}")
            return False
        if self.playing is not None:
            self.playing.shutdown()
        if w.controller.load_running:
            w.controller.set_load_running(False)
        self.playing, self.chapter_note = source, chapter_note
        self._playing_signals = SourceSignals(source)
        self._playing_signals.sigLoaded.connect(self._on_play_loaded)
        self._playing_signals.sigLoadFailed.connect(self._on_play_failed)
        w.feeder.clear()
        self.bar.follow(source)
        source.start()
        w.show_message(f"playing {Path(path).name}")
        return True

    def _on_play_loaded(self, info) -> None:
        w = self.window
        grey_out_features(w.panels, info.capabilities, info.source, True)
        w.controller.show_recorded_knobs(info.config)
        playing = self.playing
        if playing is None:  # stopped while loading
            return
        self._emphasise_recorded(playing)
        if self.chapter_note:
            w.panels.comparison.set_panels_note(self.chapter_note.format(recorded_on=playing.recorded_on))
        w.show_message(f"playing {playing.path.name}: {playing.recorded_on} (P: back to live)")

    def _on_play_failed(self, message: str) -> None:
        self.back_to_live()
        self.window.show_message(f"not played: {message}")

    def back_to_live(self) -> None:
        if self.playing is None:
            return
        self.playing.shutdown()
        self.playing = None
        w = self.window
        w.feeder.clear()
        w.panels.comparison.set_panels_note("")
        self.bar.follow(w.host if isinstance(w.host, ReplaySource) else None)
        w.controller.back_to_live()
        w.show_message(f"back to {w.host.name}")

    def shutdown(self) -> None:
        self.stop()
        if self.playing is not None:
            self.playing.shutdown()
