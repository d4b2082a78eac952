"""Readable ticks for log-scaled pyqtgraph axes: 1-2-5 per decade, labelled in plain or SI form
(pyqtgraph's own log ticks label every minor tick, and the labels run into each other). On a short axis
(a plot at 720 lines) the ticks thin out, 1-2-5, then every decade, then every second or third, until
no two labels meet."""
from __future__ import annotations

import math

from PySide6.QtGui import QFont, QFontMetrics

# (multipliers within a decade, every n-th decade), densest first
_DENSITIES = (((1, 2, 5), 1), ((1,), 1), ((1,), 2), ((1,), 3))


def tick_text(value: float) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{prefix}"
    return f"{value:g}"


def _ticks(lo: float, hi: float, steps: tuple[int, ...], every: int) -> list[tuple[float, str]]:
    e_lo, e_hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [(math.log10(m * 10.0**e), tick_text(m * 10.0**e)) for e in range(e_lo, e_hi + 1) if e % every == 0
            for m in steps if lo / 1.5 <= m * 10.0**e <= hi * 1.5]


def _fits(axis, ticks: list[tuple[float, str]], lo: float, hi: float) -> bool:
    """Whether the labels keep apart on the axis as long as it is now (unknown length: assume they do)."""
    vertical = axis.orientation in ("left", "right")
    length = axis.geometry().height() if vertical else axis.geometry().width()
    if length <= 0 or len(ticks) < 2:
        return True
    fm = QFontMetrics(axis.style.get("tickFont") or QFont())
    px_per_unit = length / (math.log10(hi * 1.5) - math.log10(lo / 1.5))
    gap = min(b[0] - a[0] for a, b in zip(ticks, ticks[1:])) * px_per_unit
    need = 1.4 * fm.height() if vertical else max(fm.horizontalAdvance(t) for _v, t in ticks) + 10
    return gap >= need


def set_log_ticks(axis, lo: float, hi: float) -> None:
    """Ticks at 1, 2, 5 x 10^k between lo and hi (data values > 0), placed in log10 coordinates; fewer
    where the axis is too short for their labels."""
    if not (lo > 0 and hi > 0):
        axis.setTicks(None)
        return
    dense = 4 if math.ceil(math.log10(hi)) - math.floor(math.log10(lo)) <= 4 else 1  # 1-2-5 over <= 4 decades
    major: list[tuple[float, str]] = []
    for steps, every in _DENSITIES[(0 if dense == 4 else 1):]:
        major = _ticks(lo, hi, steps, every)
        if _fits(axis, major, lo, hi):
            break
    axis.setTicks([major, []])
