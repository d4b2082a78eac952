"""TokenView: one streamed answer, token boundaries visible, tokens coloured by provenance.

A segment is a run of text and the tokens that produced it. Usually one token is one segment. When a
step emits several tokens (speculative decoding), the engine's per-token pieces (or a decoder, if one
was set) split its text; when they do not add up to it, or
when text was held back (partial UTF-8, stop strings) and released later, a segment carries several
tokens; its tooltip then lists them all rather than inventing boundaries.

Every segment is an anchor ("s<index>") so `anchorAt(pos)` maps the mouse to a segment exactly.
"""
from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPoint, QRect, Qt
from PySide6.QtGui import QBrush, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit, QToolTip, QWidget

from engine.events import RequestOutput, TokenLogprob, TokenSource
from widgets.theme import TOKEN_SOURCE_LABELS, token_alt_background, token_color

TokenDecoder = Callable[[int], str]  # token id -> its text (e.g. tokenizer.decode([id]))


@dataclass(frozen=True, slots=True)
class TokenInfo:
    token_id: int
    source: TokenSource
    logprob: TokenLogprob | None


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    tokens: tuple[TokenInfo, ...]
    source: TokenSource  # the colour: the tokens' source (the most common one when mixed)


def _segment(text: str, tokens: tuple[TokenInfo, ...], default: TokenSource) -> Segment:
    if not tokens:
        return Segment(text, tokens, default)
    counts = Counter(t.source for t in reversed(tokens))  # ties go to the later token
    return Segment(text, tokens, counts.most_common(1)[0][0])


def _fmt_logprob(lp: float) -> str:
    return f"{lp:.3f}" if math.isfinite(lp) else str(lp)


def _describe_token(t: TokenInfo, logprobs_on: bool) -> list[str]:
    lines = [f"token id {t.token_id} · {TOKEN_SOURCE_LABELS[t.source]}"]
    if t.logprob is None:
        lines.append("logprobs off" if not logprobs_on else "logprob: n/a")
        return lines
    lines.append(f"logprob {_fmt_logprob(t.logprob.logprob)} (p = {math.exp(t.logprob.logprob):.3f})")
    if t.logprob.top:
        alts = ", ".join(f"{text!r} {_fmt_logprob(lp)}" for _tid, lp, text in t.logprob.top)
        lines.append(f"top: {alts}")
    return lines


class TokenView(QTextEdit):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self._segments: list[Segment] = []
        self._num_flushed = 0  # segments already in the document
        self._untexted: list[TokenInfo] = []  # tokens whose text is still held back
        self._num_tokens = 0
        self._logprobs_on = False
        self._decoder: TokenDecoder | None = None

    # --- data ---------------------------------------------------------------------------------
    def set_decoder(self, decoder: TokenDecoder | None) -> None:
        self._decoder = decoder

    def set_prompt(self, text: str) -> None:
        self._segments.insert(0, Segment(text + "\n", (), TokenSource.PROMPT))
        self.rebuild()

    def add_output(self, out: RequestOutput) -> None:
        """Buffer a step's delta; the document is updated on the next `flush`."""
        n = len(out.new_token_ids)
        sources = out.sources if len(out.sources) == n else (TokenSource.DECODED,) * n
        logprobs = out.logprobs if out.logprobs is not None and len(out.logprobs) == n else (None,) * n
        self._logprobs_on = self._logprobs_on or out.logprobs is not None
        # a stream from an attached server carries text without token ids: one chunk stands for one token
        self._num_tokens += n or (1 if out.new_text and not out.token_ids else 0)
        pieces = out.new_token_pieces if not self._untexted else ()
        tokens = (*self._untexted, *(TokenInfo(t, s, lp) for t, s, lp in zip(out.new_token_ids, sources, logprobs)))
        self._untexted = []
        if not out.new_text:
            self._untexted = list(tokens)
            return
        self._segments.extend(self._split(out.new_text, tuple(tokens), pieces))

    def _split(self, text: str, tokens: tuple[TokenInfo, ...], pieces: tuple[str, ...] = ()) -> list[Segment]:
        if len(tokens) > 1 and len(pieces) != len(tokens) and self._decoder is not None:
            pieces = tuple(self._decoder(t.token_id) for t in tokens)
        if len(tokens) > 1 and len(pieces) == len(tokens):
            if all(pieces) and "".join(pieces) == text:
                return [_segment(p, (t,), t.source) for p, t in zip(pieces, tokens)]
        return [_segment(text, tokens, TokenSource.DECODED)]

    def num_tokens(self) -> int:
        return self._num_tokens

    def segments(self) -> tuple[Segment, ...]:
        return tuple(self._segments)

    def has_pending(self) -> bool:
        return self._num_flushed < len(self._segments)

    # --- document -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Append buffered segments to the document (called on the panel's repaint timer)."""
        if not self.has_pending():
            return
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()
        for i in range(self._num_flushed, len(self._segments)):
            cursor.insertText(self._segments[i].text, self._format(i))
        cursor.endEditBlock()
        self._num_flushed = len(self._segments)
        if at_bottom:
            bar.setValue(bar.maximum())

    def rebuild(self) -> None:
        """Re-render every segment (after a theme change)."""
        self.document().clear()
        self._num_flushed = 0
        self.flush()

    def _format(self, index: int) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(token_color(self._segments[index].source, self.palette()))
        # Alternating subtle background makes token boundaries visible; even segments stay clear.
        fmt.setBackground(token_alt_background(self.palette()) if index % 2 else QBrush(Qt.BrushStyle.NoBrush))
        fmt.setAnchor(True)
        fmt.setAnchorHref(f"s{index}")
        return fmt

    # --- hover --------------------------------------------------------------------------------
    def segment_at(self, pos: QPoint) -> int | None:
        """Index of the segment under a viewport position, or None."""
        href = self.anchorAt(pos)
        return int(href[1:]) if href.startswith("s") and href[1:].isdigit() else None

    def segment_rect(self, index: int) -> QRect:
        """Viewport rectangle around the first character of a flushed segment."""
        start = sum(len(s.text) for s in self._segments[:index])
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        left = self.cursorRect(cursor)
        cursor.setPosition(start + 1)
        right = self.cursorRect(cursor)
        width = max(1, right.left() - left.left()) if right.top() == left.top() else 4
        return QRect(left.left(), left.top(), width, left.height())

    def tooltip_at(self, pos: QPoint) -> str:
        index = self.segment_at(pos)
        if index is None or index >= len(self._segments):
            return ""
        seg = self._segments[index]
        if not seg.tokens:
            kind = "prompt" if seg.source is TokenSource.PROMPT else "released held-back text"
            return f"{seg.text.strip()!r}\n{kind}"
        lines = [repr(seg.text)]
        if len(seg.tokens) > 1:
            lines.append(f"{len(seg.tokens)} tokens (per-token text not available):")
        for t in seg.tokens:
            lines.extend(_describe_token(t, self._logprobs_on))
        return "\n".join(lines)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:  # theme switch: token colours depend on it
            self.rebuild()
        super().changeEvent(event)

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.ToolTip:
            text = self.tooltip_at(event.pos())
            if text:
                rich = "<p style='white-space:pre'>" + html.escape(text).replace("\n", "<br>") + "</p>"
                QToolTip.showText(event.globalPos(), rich, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)
