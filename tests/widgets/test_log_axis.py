"""Log-axis ticks thin out on a short axis: the roofline's "50G 20G 10G 5G 2G 1G" ran into each other on a
plot ~80 px tall at 720 lines (issue 49, point 1: no text over text)."""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtGui import QFont, QFontMetrics

from widgets.log_axis import set_log_ticks


def _spacing(axis, lo, hi) -> float:
    ticks = axis._tickLevels[0]
    px = axis.geometry().height() / (math.log10(hi * 1.5) - math.log10(lo / 1.5))
    return min(b[0] - a[0] for a, b in zip(ticks, ticks[1:])) * px


def test_short_axes_keep_their_labels_apart(show):
    for height, dense in ((90, False), (600, True)):
        plot = show(pg.PlotWidget(), 300, height)
        axis = plot.getAxis("left")
        set_log_ticks(axis, 1e9, 5e10)
        fm = QFontMetrics(axis.style.get("tickFont") or QFont())
        assert _spacing(axis, 1e9, 5e10) >= 1.4 * fm.height()
        labels = [t for _v, t in axis._tickLevels[0]]
        assert ("2G" in labels) == dense, (height, labels)  # 1-2-5 where there is room, decades where not
