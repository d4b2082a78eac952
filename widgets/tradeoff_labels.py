"""Where the tradeoff plot's labels go: which points get one (the frontier's, the current configuration's,
one per predicted group, then every other measured point, short) and the first free spot around each, so
that no two labels, no label and marker, and no label and the plot's edge meet. Functions of the panel
(widgets/tradeoff.py), which owns the plot, the points and the text items."""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF

from widgets.tradeoff_points import PREDICTED, free_spot, short_label


def label_candidates(panel, pos: dict) -> list[tuple[str, str]]:
    """(label key, text): frontier points first, then one point per predicted (model, device)."""
    out = [(label, label) for label in panel._frontier if label in pos]
    if panel._current in pos and panel._current not in panel._frontier:
        out.append((panel._current, panel._current))
    groups: dict[tuple, str] = {}
    for label, p in panel._predicted.items():
        if label in pos:
            groups.setdefault((p["model"], p["device"]), label)
    out += [(label, f"{m} on {d} ({PREDICTED})") for (m, d), label in groups.items()]
    labelled = {key for key, _text in out}  # then every other measured point, short, where it fits
    out += [(label, text) for label, p in panel._points.items()
            if label in pos and label not in labelled and (text := short_label(p))]
    return out

def place_labels(panel, pos: dict, bars: dict | None = None) -> None:
    """Greedy: each candidate (frontier points first, then the current configuration, then one per
    predicted group) takes the first of a few spots around its point (above, below, beside; towards
    the middle of the plot first) where its text, measured on screen, overlaps no label placed before
    it, no marker and no edge of the plot; a label with no such spot is not shown (hover shows it).
    `bars`: the spread bars (spread_bars' arguments): the view takes in their ends too."""
    fg = panel.palette().color(panel.palette().ColorRole.Text)
    logs = {k: (math.log10(x), math.log10(y)) for k, (x, y) in pos.items()}
    xs = [v[0] for v in logs.values()] or [0.0]
    mid_x = (max(xs) + min(xs)) / 2
    ys = [v[1] for v in logs.values()] or [0.0]
    b = bars or {}
    for i, (x, y) in enumerate(zip(b.get("x", []), b.get("y", []))):  # the bars' ends inside the view
        xs += [x - b["left"][i], x + b["right"][i]]
        ys += [y - b["bottom"][i], y + b["top"][i]]
    vb = panel._plot.getPlotItem().vb
    # the range the view shows, set now (auto-range would only follow at the next paint), so that a
    # label's place on screen is known while placing it
    x_range = (min(xs) - 0.08 * (max(xs) - min(xs) or 1), max(xs) + 0.08 * (max(xs) - min(xs) or 1))
    y_range = (min(ys) - 0.08 * (max(ys) - min(ys) or 1), max(ys) + 0.25 * (max(ys) - min(ys) or 1))
    vb.setRange(xRange=x_range, yRange=y_range, padding=0)
    box = vb.sceneBoundingRect()

    def on_screen(lx: float, ly: float) -> QPointF:
        return QPointF(box.left() + (lx - x_range[0]) / (x_range[1] - x_range[0]) * box.width(),
                       box.bottom() - (ly - y_range[0]) / (y_range[1] - y_range[0]) * box.height())

    r = panel._scatter.opts.get("size", 13) / 2 + 2  # a marker's half-size on screen, and a margin
    centres = [on_screen(lx, ly) for lx, ly in logs.values()]
    markers = [QRectF(c.x() - r, c.y() - r, 2 * r, 2 * r) for c in centres]
    placed: list[QRectF] = []
    shown = set()
    for key, text in label_candidates(panel, pos):
        lx, ly = logs[key]
        item = panel._labels.get(key)
        if item is None:
            item = panel._labels[key] = pg.TextItem()
            panel._plot.addItem(item)
        item.setText(text)
        size = item.textItem.boundingRect()  # as drawn: the label's own font (presenter sizes)
        w, h = size.width(), size.height()
        spot = free_spot(on_screen(lx, ly), w, h, r, lx > mid_x, box, placed + markers)
        if spot is None:
            item.setVisible(False)
            continue
        (ax, ay), rect = spot
        placed.append(rect)
        item.setColor(fg)
        item.setAnchor((ax, ay))
        item.setPos(lx, ly)  # log mode: text items sit in log10 coordinates
        item.setVisible(True)
        shown.add(key)
    for key in set(panel._labels) - shown:
        panel._plot.removeItem(panel._labels.pop(key))

