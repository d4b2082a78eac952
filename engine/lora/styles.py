"""Style rewrites for `inferlab train-lora`: deterministic functions of the model's own answers, so an
adapter has something visible and learnable to pick up in a few minutes of CPU training."""
from __future__ import annotations

import re
from types import MappingProxyType

_PIRATE = MappingProxyType({
    "hello": "ahoy", "hi": "ahoy", "you": "ye", "your": "yer", "my": "me", "is": "be", "are": "be",
    "the": "th'", "friend": "matey", "friends": "hearties", "yes": "aye", "money": "doubloons",
    "treasure": "booty", "stop": "avast", "wow": "blimey", "of": "o'", "to": "t'", "and": "an'",
})
_WORD = re.compile(r"[A-Za-z]+")


def shout(text: str) -> str:
    """Every letter in capitals."""
    return text.upper()


def pirate(text: str) -> str:
    """A pirate's words for common ones (keeping capitals), and 'Arr!' at the end."""
    def swap(m: re.Match) -> str:
        word = m.group(0)
        new = _PIRATE.get(word.lower())
        if new is None:
            return word
        return new[0].upper() + new[1:] if word[0].isupper() else new

    return _WORD.sub(swap, text).rstrip() + " Arr!"


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def bullets(text: str) -> str:
    """Each sentence on a line of its own, as a bullet point."""
    sentences = [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    return "\n".join(f"- {s}" for s in sentences)


STYLES = MappingProxyType({"shout": shout, "pirate": pirate, "bullets": bullets})
