"""The app's sliders on a managed server: which knobs take a restart, the point they make, and what a
restart changes in the engine's own words (its flags, read off the two command lines)."""
from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import replace

from app.managed.formats import SERVER_FORMAT_BY_NAME, for_slider
from app.managed.table import ServerPoint
from engine.knobs import KnobValues, Use, knobs_for

# the app's knob (its slider's name, engine/knobs.py: the rows offered to a restart) -> the ServerPoint field it moves
KNOB_FIELDS = {"max_num_seqs": "batch", "quant_format": "weight_format", "num_speculative_tokens": "draft"}
RESTARTABLE = tuple(row.name for row in knobs_for(Use.RESTART))


def knob_values(point: ServerPoint) -> KnobValues:
    """The sliders' values for `point` (its weight format by the slider stop it stands for:
    app/managed/formats.py)."""
    fmt = SERVER_FORMAT_BY_NAME.get(point.weight_format)
    return KnobValues(max_num_seqs=point.batch, quant_format=fmt.slider if fmt and fmt.slider else point.weight_format,
                      num_speculative_tokens=point.draft)


def point_with(point: ServerPoint, knobs: dict, engine: str, have: Collection[str] = ()) -> ServerPoint:
    """`point` with the sliders' new values on `engine` (the weights slider's stop becomes that engine's format,
    the first of `have`, the formats the model has weights for); ValueError for a knob that is not restartable
    or a value that is not a whole number (the caller's thread hears it at once)."""
    fields: dict[str, object] = {}
    for knob, value in knobs.items():
        if knob not in KNOB_FIELDS:
            raise ValueError(f"{knob} does not change by restarting the server (restartable: "
                             f"{', '.join(RESTARTABLE)})")
        if knob == "quant_format":
            if not isinstance(value, str):
                raise ValueError(f"quant_format names a weight format, not {value!r}")
            fields[KNOB_FIELDS[knob]] = for_slider(engine, value, have).name
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{knob} must be a whole number ≥ 0, not {value!r}")
        fields[KNOB_FIELDS[knob]] = value
    return replace(point, **fields)  # type: ignore[arg-type]


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
