"""Cues: a preset's scripted moments (a burst, a knob turned, a note), on a timeline that repeats or on a key.

A talk's chapter is about a moment (the burst that jams the queue, the switch that clears it). Left to
Poisson arrivals, that moment has passed by the time the audience looks. A preset lists its cues:

    [cues]
    every_s = 40                       # the timeline repeats (0: play once)
    [[cues.at]]
    at_s = 6
    burst = 3                          # long prompts, the preset's burst shape
    note = "three long prompts arrive"
    [[cues.at]]
    at_s = 20
    set = { enable_chunked_prefill = true }
    note = "chunked prefill on: decodes slip in between the chunks"
    [[cues.at]]
    at_s = 30
    ask = "Tell me about the moon."    # multi-LoRA: one prompt to the base model and every adapter at once

`CueTimeline.due(elapsed_s)` hands out each cue once per period as time passes; `next_cue()` (the N key)
plays the next one at once, and the timeline continues from there. Pure Python: the controller acts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.knobs import Use, knobs_for

# knobs a cue may set: the knob table's rows offered to cues (engine/knobs.py, Use.CUE), each value checked
# against its row in the range the app offers (the controller applies them like the sliders do)
CUE_KNOBS = {row.name: row for row in knobs_for(Use.CUE)}


@dataclass(frozen=True, slots=True)
class Cue:
    at_s: float
    burst: int = 0
    set: dict = field(default_factory=dict)
    note: str = ""
    ask: str = ""  # one prompt to the base model and every LoRA adapter at once (the LoRA panel shows them)

    def describe(self) -> str:
        if self.note:
            return self.note
        parts = [f"burst of {self.burst}"] if self.burst else []
        parts += [f"every adapter answers {self.ask!r}"] if self.ask else []
        parts += [f"{k} = {v}" for k, v in self.set.items()]
        return ", ".join(parts)


def parse_cues(table: dict) -> tuple[tuple[Cue, ...], float]:
    """([cues] table) -> (cues by time, period in seconds). Raises ValueError("key: why") for a bad one."""
    unknown = set(table) - {"every_s", "at"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown key; expected every_s, at")
    period = table.get("every_s", 0)
    if isinstance(period, bool) or not isinstance(period, (int, float)) or not math.isfinite(period) or period < 0:
        raise ValueError(f"every_s: expected a number >= 0, got {period!r}")
    entries = table.get("at", [])
    if not isinstance(entries, list) or any(not isinstance(e, dict) for e in entries):
        raise ValueError("at: expected [[cues.at]] tables")
    cues = tuple(sorted((_parse_one(e) for e in entries), key=lambda c: c.at_s))
    if period and cues and cues[-1].at_s >= period:
        raise ValueError(f"at_s: {cues[-1].at_s:g} s lies beyond the period every_s = {period:g} s")
    return cues, float(period)


def _parse_one(entry: dict) -> Cue:
    unknown = set(entry) - {"at_s", "burst", "set", "note", "ask"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown key; expected at_s, burst, set, note, ask")
    at = entry.get("at_s")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < 0:
        raise ValueError(f"at_s: expected a number of seconds >= 0, got {at!r}")
    burst = entry.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 0 <= burst <= 64:
        raise ValueError(f"burst: expected an integer in [0, 64], got {burst!r}")
    knobs = entry.get("set", {})
    if not isinstance(knobs, dict):
        raise ValueError("set: expected a table of knobs, e.g. set = { enable_chunked_prefill = true }")
    for key, value in knobs.items():
        row = CUE_KNOBS.get(key)
        if row is None:
            raise ValueError(f"set.{key}: not a knob a cue can turn; one of {', '.join(CUE_KNOBS)}")
        why = row.problem(value, app=True)
        if why:
            raise ValueError(f"set.{key}: {why}, got {value!r}")
    note, ask = entry.get("note", ""), entry.get("ask", "")
    if not isinstance(note, str):
        raise ValueError("note: expected a string")
    if not isinstance(ask, str):
        raise ValueError("ask: expected the prompt, a string")
    if not burst and not knobs and not note and not ask.strip():
        raise ValueError("a cue needs a burst, a set, an ask or a note")
    turned = {k: CUE_KNOBS[k].check(v, app=True) for k, v in knobs.items()}
    return Cue(at_s=float(at), burst=burst, set=turned, note=note.strip(), ask=ask.strip())


class CueTimeline:
    """Which cues are due as time passes (each once per period), and the N key's `next_cue`."""

    def __init__(self, cues: tuple[Cue, ...], period_s: float = 0.0) -> None:
        self.cues = cues
        self.period_s = period_s
        self._played = 0  # cues handed out so far, counting every period

    def _time_of(self, n: int) -> float:
        k = len(self.cues)
        lap, i = divmod(n, k)
        return lap * self.period_s + self.cues[i].at_s

    def due(self, elapsed_s: float) -> list[Cue]:
        """The cues whose time has come since the last call (in order)."""
        out = []
        while self.cues and (self.period_s > 0 or self._played < len(self.cues)):
            if self._time_of(self._played) > elapsed_s:
                break
            out.append(self.cues[self._played % len(self.cues)])
            self._played += 1
        return out

    def next_cue(self) -> tuple[Cue | None, float]:
        """Play the next cue now: (the cue, its place on the timeline). The caller moves its clock there, so
        the cues after it keep their spacing; (None, 0) when a timeline that plays once is over."""
        if not self.cues or (self.period_s <= 0 and self._played >= len(self.cues)):
            return None, 0.0
        cue, at = self.cues[self._played % len(self.cues)], self._time_of(self._played)
        self._played += 1
        return cue, at

    def restart(self) -> None:
        self._played = 0
