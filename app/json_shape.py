"""Checks of the shapes of JSON the app wrote and reads back (stored comparisons, stored sweeps): a file
edited or damaged into another shape is refused where it is read, never met by a panel."""
from __future__ import annotations

import math
from collections.abc import Callable


def finite_number(v) -> bool:
    """An int or float (not a bool: JSON's true is no figure) that is finite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def text_or_none(v) -> bool:
    return v is None or isinstance(v, str)


def list_of(v, ok: Callable[[object], bool]) -> bool:
    return isinstance(v, list) and all(ok(x) for x in v)
