"""Readable ticks for log-scaled pyqtgraph axes: 1-2-5 per decade, labelled in plain or SI form
(pyqtgraph's own log ticks label every minor tick, and the labels run into each other)."""
from __future__ import annotations

import math


def tick_text(value: float) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{prefix}"
    return f"{value:g}"


def set_log_ticks(axis, lo: float, hi: float) -> None:
    """Ticks at 1, 2, 5 x 10^k between lo and hi (data values > 0), placed in log10 coordinates."""
    if not (lo > 0 and hi > 0):
        axis.setTicks(None)
        return
    e_lo, e_hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1, 2, 5) if e_hi - e_lo <= 4 else (1,)
    major = [(math.log10(m * 10.0**e), tick_text(m * 10.0**e)) for e in range(e_lo, e_hi + 1) for m in steps
             if lo / 1.5 <= m * 10.0**e <= hi * 1.5]
    axis.setTicks([major, []])
