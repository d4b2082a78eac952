"""The app's sliders on a managed server: which knobs take a restart, the point they make, and what a
restart changes in the engine's own words (its flags, read off the two command lines)."""
from __future__ import annotations

import os
from dataclasses import replace

from app.managed.table import ServerPoint

# the app's knob (its slider's name, engine/knobs.py) -> the ServerPoint field it moves
KNOB_FIELDS = {"max_num_seqs": "batch", "quant_bits": "bits", "num_speculative_tokens": "draft"}
RESTARTABLE = tuple(KNOB_FIELDS)


def knob_values(point: ServerPoint) -> dict:
    """The sliders' values for `point`."""
    return {knob: getattr(point, name) for knob, name in KNOB_FIELDS.items()}


def point_with(point: ServerPoint, knobs: dict) -> ServerPoint:
    """`point` with the sliders' new values; ValueError for a knob that is not restartable or a value
    that is not a whole number (the caller's thread hears it at once)."""
    fields = {}
    for knob, value in knobs.items():
        if knob not in KNOB_FIELDS:
            raise ValueError(f"{knob} does not change by restarting the server (restartable: "
                             f"{', '.join(RESTARTABLE)})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{knob} must be a whole number ≥ 0, not {value!r}")
        fields[KNOB_FIELDS[knob]] = value
    return replace(point, **fields)


def _is_flag(token: str) -> bool:
    if not token.startswith("-") or len(token) < 2:
        return False
    try:
        float(token)  # "-1" is a value
    except ValueError:
        return True
    return False


def flag_items(argv: list[str]) -> dict[str, str | None]:
    """flag -> its value (None for a switch), for everything after the program."""
    out: dict[str, str | None] = {}
    tokens = argv[1:]
    for i, token in enumerate(tokens):
        if not _is_flag(token):
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        out[token] = nxt if nxt is not None and not _is_flag(nxt) else None
    return out


def changed_flags(old_argv: list[str], new_argv: list[str]) -> str:
    """What the new command line sets differently, as the engine spells it: "-np 8",
    "-m model-Q4_1.gguf", "without --draft-max" (files by their name; the full line is shown elsewhere)."""
    old, new = flag_items(old_argv), flag_items(new_argv)
    parts = []
    for flag, value in new.items():
        if flag in old and old[flag] == value:
            continue
        shown = os.path.basename(value) if value and os.sep in value else value
        parts.append(flag if value is None else f"{flag} {shown}")
    parts += [f"without {flag}" for flag in old if flag not in new]
    return " ".join(parts) or "the same flags"
