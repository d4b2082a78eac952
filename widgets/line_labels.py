"""Labels of vertical lines (cues on the timeline, percentiles and budgets on the histograms) placed so
that each stays inside its plot and none prints over another.

Each label goes right of its line where it fits, else left of it, else wrapped between words onto lines
that fit; then into the first free slot from the top of the plot (slots one text line apart). A label
with no free slot is hidden rather than drawn over another (what it says is shown elsewhere too).
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QFontMetricsF


def wrap_words(text: str, fm: QFontMetricsF, width: float) -> str:
    """`text` broken between words into lines at most `width` wide (a word wider than that on its own)."""
    lines: list[str] = []
    for word in text.split():
        if lines and fm.horizontalAdvance(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


def place_line_labels(vb: pg.ViewBox, marks: list[tuple[float, pg.InfLineLabel, str]],
                      avoid: list[QRectF] = ()) -> None:
    """marks: (the line's x in view coordinates, its label, the label's text), placed in this order;
    avoid: what else a label must not cover (a legend inside the plot), in scene coordinates."""
    box = vb.sceneBoundingRect()
    if box.width() <= 0 or box.height() <= 0:
        return
    taken: list[QRectF] = list(avoid)
    for x, label, text in marks:
        if not label.line.isVisible():
            continue
        at = vb.mapViewToScene(QPointF(x, 0)).x()
        fm = QFontMetricsF(label.textItem.font())
        # the text item draws its text inside a margin of its own on each side
        margin = 2 * label.textItem.document().documentMargin() + 2
        room = max(box.right() - at, at - box.left()) - margin
        label.setFormat(text if fm.horizontalAdvance(text) <= room else wrap_words(text, fm, room))
        size = label.textItem.boundingRect()
        right = at + size.width() <= box.right()
        left = at if right else at - size.width()
        label.anchors = [(0, 0), (0, 0)] if right else [(1, 0), (1, 0)]
        step = fm.height() + 2
        free = None
        top = box.top() + 1
        while top + size.height() <= box.bottom():
            rect = QRectF(left, top, size.width(), size.height())
            if not any(rect.intersects(t) for t in taken):
                free = rect
                break
            top += step
        label.setVisible(free is not None)
        if free is not None:
            taken.append(free)
            label.setPosition((box.bottom() - free.top()) / box.height())
