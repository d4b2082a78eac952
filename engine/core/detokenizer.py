"""IncrementalDetokenizer: token ids in, text deltas out, for streaming.

Two things are held back before text is released:
1. bytes of an incomplete UTF-8 character. Byte-level BPE can split one character (an emoji, a CJK
   character) across tokens; decoding the first half alone gives U+FFFD. Like vLLM, we decode a small
   window of earlier tokens plus the new ones and compare with the window alone; while the result
   ends in U+FFFD the new tokens stay unreleased.
2. text that might be the start of a stop string. It waits until it either completes a stop string
   (then everything from the stop string on is dropped) or can no longer become one.

Each push costs O(new tokens + window + longest stop string), never O(text so far). Where the tokenizer
has one (Tokenizer.decode_stream: the tokenizers library's DecodeStream), point 1 is its work: one call a
token instead of two decodes of the window; the window is then decoded only to flush held tokens at the end.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the core never loads anything
    from engine.loading.tokenizer import Tokenizer

# Decoding starts this many tokens before the first unreleased one, so that tokenizers whose decode
# depends on the previous token (a leading space in sentencepiece, a split character) see enough of it.
PREFIX_WINDOW = 5
MAX_CHAR_TOKENS = 4  # a UTF-8 character is at most 4 bytes: at most 4 byte tokens


class IncrementalDetokenizer:
    __slots__ = (
        "_ids", "_max_stop_len", "_pending", "_read_offset", "_skip_special", "_step", "_stop", "_text",
        "_tokenizer", "finished", "stopped",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._stop = [s for s in (stop or []) if s]
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        self._skip_special = skip_special_tokens
        # _ids is [decoded context | tokens not decoded yet]; only the tail of the prompt matters.
        self._ids: list[int] = self._context(prompt_token_ids)
        self._read_offset = len(self._ids)  # first token whose text is not yet decoded
        # the library's incremental decoder, primed with the same context (None: decode windows here)
        self._step = tokenizer.decode_stream(self._ids, skip_special_tokens) \
            if hasattr(tokenizer, "decode_stream") else None
        self._pending = ""  # decoded text held back for a possible stop string
        self._text = ""  # all released text; `text` is read after every step, so keep it joined
        self.stopped = False  # a stop string matched
        self.finished = False

    # -- public ----------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """All text released so far."""
        return self._text

    @property
    def held_back_chars(self) -> int:
        """Characters decoded but not released yet (a possible stop string)."""
        return len(self._pending)

    @property
    def held_back_tokens(self) -> int:
        """Generated tokens whose text is still incomplete (part of a UTF-8 character)."""
        return len(self._ids) - self._read_offset

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text newly released by them (possibly "")."""
        if self.stopped or self.finished:
            return ""
        if len(token_ids) == 1:  # a decode step's one token
            self._ids.append(token_ids[0])
            return self._release(self._decode_new(), final=False)
        decoded = []
        for token_id in token_ids:
            self._ids.append(token_id)
            decoded.append(self._decode_new())
        return self._release("".join(decoded), final=False)

    def finish(self) -> str:
        """The request ended without a stop string: release everything still held, including an
        incomplete character (as U+FFFD, which is what the full decode shows too)."""
        if self.stopped or self.finished:
            return ""
        tail = ""
        if self._read_offset < len(self._ids):
            prefix_text = self._decode(self._ids[:self._read_offset])
            tail = self._decode(self._ids)[len(prefix_text):]
        out = self._release(tail, final=True)
        self.finished = True
        return out

    # -- internals -------------------------------------------------------------------------------

    def _context(self, prompt_token_ids: list[int]) -> list[int]:
        """The prompt's last PREFIX_WINDOW tokens, or up to MAX_CHAR_TOKENS more where those begin inside a
        character: a sentencepiece byte-fallback decoder turns a whole run of byte tokens that starts
        mid-character into U+FFFD, which would swallow the next generated characters too."""
        for extra in range(MAX_CHAR_TOKENS + 1):
            tail = list(prompt_token_ids[-(PREFIX_WINDOW + extra):])
            if len(tail) == len(prompt_token_ids) or not self._decode(tail).startswith("\ufffd"):
                return tail
        return list(prompt_token_ids[-PREFIX_WINDOW:])

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _decode_new(self) -> str:
        """Text of the tokens after _read_offset, or "" while they end inside a character."""
        if self._step is not None:
            try:
                text = self._step(self._ids[-1])
            except Exception:  # noqa: BLE001 (the library refused this sequence: windows from here on)
                self._step = None
                return self._decode_new()
            if text is None:
                return ""  # half a character so far (or nothing to show yet): the stream holds it
            del self._ids[:-PREFIX_WINDOW]  # the context finish() decodes held tokens against
            self._read_offset = len(self._ids)
            return text
        prefix_text = self._decode(self._ids[:self._read_offset])
        new_text = self._decode(self._ids)
        if new_text.endswith("\ufffd"):
            return ""  # half a character so far: wait for the token that completes it
        # Everything is decoded now: keep the last PREFIX_WINDOW tokens as context for the next one
        # and drop the rest, so memory and work per token stay O(window).
        del self._ids[:-PREFIX_WINDOW]
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]

    def _release(self, new_text: str, final: bool) -> str:
        if not self._stop:  # nothing to hold back for (the common request): all of it goes out
            self._text += new_text
            return new_text
        text = self._pending + new_text
        if self._stop:
            cut = _first_stop(text, self._stop)
            if cut is not None:
                self.stopped = True
                self._pending = ""
                return self._emit(text[:cut])
        hold = 0 if final else _longest_stop_prefix_suffix(text, self._stop, self._max_stop_len)
        self._pending = text[len(text) - hold:] if hold else ""
        return self._emit(text[:len(text) - hold])

    def _emit(self, text: str) -> str:
        self._text += text
        return text


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop string starts in text, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _longest_stop_prefix_suffix(text: str, stops: list[str], max_len: int) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    for n in range(min(len(text), max_len - 1), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0
