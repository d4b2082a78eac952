"""A number's check against a knob's range, in the words a preset's or a flag's error shows
("expected an integer in [1, 256]"). Torch-free: engine/knobs.py's rows call it."""
from __future__ import annotations

import math
import numbers
from typing import Any


def number_problem(value: Any, integer: bool, low: float | None, high: float | None, low_exclusive: bool,
                   or_none: bool) -> str | None:
    """What is wrong with `value` as an integer (`integer`) or a real number within [low, high] (low
    excluded when `low_exclusive`), or None when it is fine. `or_none`: the message says none is taken too."""
    kind = "an integer" if integer else "a number"
    ok = not isinstance(value, bool) and isinstance(value, numbers.Integral if integer else numbers.Real)
    ok = ok and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_exclusive else value >= low
    if ok and high is not None:
        ok = value <= high
    if ok:
        return None
    def show(x: float) -> str:
        return str(int(x)) if integer else f"{x:g}"

    if low is not None and high is not None:
        rng = f"in {'(' if low_exclusive else '['}{show(low)}, {show(high)}]"
    elif low is not None:
        rng = f"> {show(low)}" if low_exclusive else f">= {show(low)}"
    else:
        rng = ""
    return f"expected {kind} {rng}".rstrip() + (" or none" if or_none else "")
