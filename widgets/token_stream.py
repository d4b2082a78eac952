"""TokenStreamPanel: a prompt box, and the streamed answers as tabs (one per request id)."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.events import RequestOutput, TokenSource
from widgets.fmt import ms, rate
from widgets.panel_base import Panel
from widgets.theme import TOKEN_SOURCE_LABELS, adapter_color, token_alt_background, token_color
from widgets.token_view import TokenDecoder, TokenView

DEFAULT_MAX_STREAMS = 24  # older tabs are dropped (finished ones first) beyond this


@dataclass(slots=True)
class _Stream:
    title: str
    page: QWidget
    view: TokenView
    status: QLabel
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    held_back_chars: int = 0
    status_dirty: bool = True
    adapter: str | None = None  # the LoRA adapter the request runs with (None: the base model, or no pool)


def _status_text(s: _Stream) -> str:
    parts = [f"LoRA {s.adapter}"] if s.adapter else []
    parts += [f"TTFT {ms(s.ttft_s)}", rate(s.tokens_per_s, "tok/s"), f"{s.view.num_tokens()} tokens"]
    if s.held_back_chars:
        parts.append(f"{s.held_back_chars} chars held back")
    if s.finished:
        parts.append(f"finished: {s.finish_reason or '?'}")
    if s.error:
        parts.append(f"error: {s.error}")
    return " · ".join(parts)


class TokenStreamPanel(Panel):
    sigSubmit = Signal(str, bool)  # (prompt, apply chat template)

    def __init__(self, parent: QWidget | None = None, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        super().__init__(parent)
        self._max_streams = max_streams
        self._streams: dict[str, _Stream] = {}
        self._decoder: TokenDecoder | None = None

        self._prompt = QPlainTextEdit()
        self._prompt.setPlaceholderText("Type a prompt… (Ctrl+Enter sends)")
        self._prompt.setMaximumHeight(72)
        self._chat = QCheckBox("chat template")
        self._chat.setChecked(True)
        self._send = QPushButton("Send")
        self._send.clicked.connect(self._on_send)
        shortcut = QShortcut(QKeySequence("Ctrl+Return"), self._prompt)
        shortcut.setContext(Qt.ShortcutContext.WidgetShortcut)
        shortcut.activated.connect(self._on_send)
        self._legend = QLabel()
        self._legend.setWordWrap(True)  # a long legend wraps instead of widening the panel
        self._tabs = QTabWidget()
        self._tabs.setDocumentMode(True)
        self._empty = QLabel("No streams yet: send a prompt or start the load generator.")
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)  # the hint wraps in a narrow dock instead of widening the window

        row = QHBoxLayout()
        row.addWidget(self._chat)
        row.addStretch(1)
        row.addWidget(self._send)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._prompt)
        layout.addLayout(row)
        layout.addWidget(self._legend)
        layout.addWidget(self._tabs, 1)
        layout.addWidget(self._empty, 1)
        self._tabs.hide()
        self._update_legend()

    # --- setters ------------------------------------------------------------------------------
    def set_token_decoder(self, decoder: TokenDecoder | None) -> None:
        """token id -> text, used to split a multi-token step's text into per-token pieces."""
        self._decoder = decoder
        for s in self._streams.values():
            s.view.set_decoder(decoder)

    def add_stream(self, request_id: str, title: str, prompt: str | None = None, activate: bool = True,
                   adapter: str | None = None) -> None:
        """activate=False adds the tab without switching to it (background streams). adapter: the LoRA
        adapter the request runs with: its name in the tab's title and status, in the adapter's colour."""
        if request_id in self._streams:
            return
        self._evict_if_full()
        page = QWidget()
        status = QLabel()
        status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        view = TokenView(page)
        # it scrolls: two lines are its least (its default least, ~4 lines, made a 720-line presenter screen
        # overflow by a line once the stream tabs appeared beside the acceptance panel)
        view.setMinimumHeight(2 * view.fontMetrics().lineSpacing() + 2 * view.frameWidth())
        view.set_decoder(self._decoder)
        if prompt:
            view.set_prompt(prompt)
        lay = QVBoxLayout(page)
        lay.setContentsMargins(0, 2, 0, 0)
        lay.addWidget(status)
        lay.addWidget(view, 1)
        if adapter:
            title = f"{title} · {adapter}"
            status.setStyleSheet(f"QLabel {{ border-left: 6px solid {adapter_color(adapter).name()}; "
                                 "padding-left: 4px; }")
        self._streams[request_id] = _Stream(title, page, view, status, adapter=adapter)
        self._tabs.addTab(page, title)
        if adapter:
            self._tabs.tabBar().setTabTextColor(self._tabs.indexOf(page), adapter_color(adapter))
        if activate or self._tabs.count() == 1:
            self._tabs.setCurrentWidget(page)
        self._tabs.show()
        self._empty.hide()
        self._mark_dirty()

    def append_output(self, out: RequestOutput) -> None:
        if out.request_id not in self._streams:
            self.add_stream(out.request_id, out.request_id)
        s = self._streams[out.request_id]
        s.view.add_output(out)
        s.held_back_chars = out.held_back_chars
        s.finished = s.finished or out.finished
        s.finish_reason = out.finish_reason or s.finish_reason
        s.error = out.error or s.error
        s.status_dirty = True
        self._mark_dirty()

    def set_stream_timing(self, request_id: str, ttft_s: float | None, tokens_per_s: float | None) -> None:
        s = self._streams.get(request_id)
        if s is None:
            return
        s.ttft_s, s.tokens_per_s, s.status_dirty = ttft_s, tokens_per_s, True
        self._mark_dirty()

    def remove_stream(self, request_id: str) -> None:
        s = self._streams.pop(request_id, None)
        if s is None:
            return
        self._tabs.removeTab(self._tabs.indexOf(s.page))
        s.page.deleteLater()
        if not self._streams:
            self._tabs.hide()
            self._empty.show()

    def reset(self) -> None:
        for rid in list(self._streams):
            self.remove_stream(rid)

    def view(self, request_id: str) -> TokenView:
        """The TokenView of a stream (for hit tests: segment_rect, tooltip_at)."""
        return self._streams[request_id].view

    def snapshot_data(self) -> dict:
        streams = {}
        for rid, s in self._streams.items():
            segs = s.view.segments()
            counts: dict[str, int] = {}
            for seg in segs:
                for t in seg.tokens:
                    counts[t.source.value] = counts.get(t.source.value, 0) + 1
            streams[rid] = {
                "title": s.title, "text": "".join(seg.text for seg in segs if seg.tokens),
                "num_tokens": s.view.num_tokens(), "num_segments": len(segs),
                "sources": counts, "finished": s.finished, "finish_reason": s.finish_reason,
                "ttft_s": s.ttft_s, "tokens_per_s": s.tokens_per_s, "status": s.status.text(),
                "held_back_chars": s.held_back_chars, "adapter": s.adapter,
            }
        current = next((rid for rid, s in self._streams.items() if s.page is self._tabs.currentWidget()), None)
        return {"streams": streams, "current": current, "num_streams": len(streams)}

    # --- internals ----------------------------------------------------------------------------
    def _evict_if_full(self) -> None:
        if len(self._streams) < self._max_streams:
            return
        finished = [rid for rid, s in self._streams.items() if s.finished]
        self.remove_stream(finished[0] if finished else next(iter(self._streams)))

    def _repaint(self) -> None:
        for s in self._streams.values():
            s.view.flush()
            if s.status_dirty:
                s.status_dirty = False
                s.status.setText(_status_text(s))
                failed = s.error or s.finish_reason in ("error", "rejected", "abort")
                mark = "✗ " if failed else ("✓ " if s.finished else "● ")
                self._tabs.setTabText(self._tabs.indexOf(s.page), mark + s.title)

    def _update_legend(self) -> None:
        pal = self.palette()
        alt = token_alt_background(pal).name()
        chips = " ".join(
            f"<span style='color:{token_color(src, pal).name()}; background:{alt}'>&nbsp;■ "
            f"{TOKEN_SOURCE_LABELS[src]}&nbsp;</span>" for src in TokenSource)
        self._legend.setText(f"{chips} &nbsp; <i>shaded: token boundaries · hover a token</i>")

    def _on_palette_changed(self) -> None:
        self._update_legend()  # each TokenView re-renders itself on its own PaletteChange

    def _on_send(self) -> None:
        prompt = self._prompt.toPlainText().strip()
        if prompt:
            self.sigSubmit.emit(prompt, self._chat.isChecked())
