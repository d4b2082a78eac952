"""Presenter scale for plots, and a check that no text on a panel is cut.

The app font grows in presenter mode (Qt widgets follow it), but pyqtgraph draws axis ticks, axis labels,
plot titles, legends and curves with sizes of its own. `scale_plots` multiplies each of them by one factor
(and back: the sizes a panel set are remembered on first use), so the charts can be read from the back of
a room, not only the caption. `clipped_texts` lists every label, plot title and axis label whose text is
wider than the room it has: what a projector would show as "time per output toke".
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QFont, QFontMetrics, QTextDocument
from PySide6.QtWidgets import QLabel, QWidget

TICK_PT = 8.5  # pyqtgraph's defaults, the base that a scale multiplies
LABEL_PT = 9.0
TITLE_PT = 11.0
_BASE = "_presenter_base"  # attribute on a graphics item: the sizes it had at scale 1
_CHIPS = "_presenter_chips"  # on a plot whose legend became chips: (title, [(html, plain)], scale)
_FITTED = "_presenter_fitted"  # on a title label: (the text the panel set, the text shown after fitting)
MIN_PT = 7.0  # fitting never shrinks text below this


def plot_items(root: QWidget) -> list[pg.PlotItem]:
    """Every PlotItem drawn inside `root` (PlotWidgets and GraphicsLayoutWidgets)."""
    items: list[pg.PlotItem] = []
    for view in root.findChildren(pg.GraphicsView):
        scene = view.scene()
        if scene is None:
            continue
        items.extend(i for i in scene.items() if isinstance(i, pg.PlotItem))
    return list(dict.fromkeys(items))


def scale_plots(root: QWidget, scale: float) -> None:
    """Fonts, line widths, marker sizes and legends of every plot in `root` at `scale` x their base."""
    for plot in plot_items(root):
        _scale_axes(plot, scale)
        _scale_title(plot, scale)
        for item in plot.items:
            if isinstance(item, pg.PlotDataItem):
                _scale_curve(item, scale)
            elif isinstance(item, pg.ScatterPlotItem):
                _scale_scatter(item, scale)
        _legend_into_title(plot, scale)
        _fit_title_row(plot)


def _base(item, **current):
    base = getattr(item, _BASE, None)
    if base is None:
        base = dict(current)
        setattr(item, _BASE, base)
    return base


def _scale_axes(plot: pg.PlotItem, scale: float) -> None:
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        font = QFont(axis.style.get("tickFont") or QFont())
        base = _base(axis, tick_pt=font.pointSizeF() if font.pointSizeF() > 0 else TICK_PT)
        font.setPointSizeF(base["tick_pt"] * scale)
        axis.setStyle(tickFont=font, tickTextOffset=max(2, int(round(3 * scale))))
        _fit_ticks(axis, on=True)  # at every scale: a narrow plot's ticks ran together ("5001000 1500")
        axis.labelStyle["font-size"] = f"{LABEL_PT * scale:.1f}pt"
        axis._updateLabel()  # pyqtgraph re-renders the label HTML from labelStyle here
        if name in ("left", "right"):
            axis.setWidth(None)  # let the axis grow with its tick text
        else:
            axis.setHeight(None)


def _fit_ticks(axis: pg.AxisItem, on: bool) -> None:
    """Large tick text on a short axis overlaps ("1000 2000 3000" run together, "15 10 5" stacked): while
    enlarged, widen the major spacing (x2, x2.5, x2 ...) until each label has room, and drop minor ticks."""
    if not on:
        axis.__dict__.pop("tickSpacing", None)  # back to the class's method
        return
    horizontal = axis.orientation in ("bottom", "top")

    def spacing(min_val: float, max_val: float, size: float):
        levels = type(axis).tickSpacing(axis, min_val, max_val, size)
        if not levels or max_val <= min_val or size <= 0:
            return levels
        major, offset = levels[0]
        metrics = QFontMetrics(axis.style["tickFont"] or QFont())
        widest = (max(metrics.horizontalAdvance(t) for t in axis.tickStrings([min_val, max_val], 1.0, major))
                  if horizontal else metrics.height())
        px = size / (max_val - min_val)
        steps = (2.0, 2.5, 2.0)  # 1 -> 2 -> 5 -> 10 ...
        i = 0
        while major * px < 1.5 * widest and (max_val - min_val) / (major * steps[i % 3]) >= 1.0:
            major *= steps[i % 3]
            i += 1
        return [(major, offset)]

    axis.tickSpacing = spacing
    axis.picture = None  # redraw with the new spacing


def _scale_title(plot: pg.PlotItem, scale: float) -> None:
    label = plot.titleLabel
    if not label.text:
        return
    label.setText(label.text, size=f"{TITLE_PT * scale:.1f}pt")  # the size stays for later setTitle calls


def _fit_title_row(plot: pg.PlotItem) -> None:
    """pyqtgraph gives the title a fixed 30 px row; an enlarged or two-line title needs its own height
    (a later setTitle by the panel sets 30 px again: one line at presenter size fits in that)."""
    label = plot.titleLabel
    if not label.text:
        return
    height = max(30, int(label.item.boundingRect().height()) + 2)
    label.setMaximumHeight(height)
    plot.layout.setRowFixedHeight(0, height)


def legends_outside(root: QWidget) -> None:
    """Every plot's legend in `root` as a line of coloured chips under its title, outside the data (a
    legend box inside the plot covered the bars it explains, at every scale), and its ticks spaced so
    that no two labels meet on a narrow axis."""
    for plot in plot_items(root):
        _legend_into_title(plot, 1.0)
        _fit_title_row(plot)
        for name in ("left", "bottom", "right", "top"):
            _fit_ticks(plot.getAxis(name), on=True)


def _legend_into_title(plot: pg.PlotItem, scale: float) -> None:
    """A legend box covers the data it explains (issue 49: the timeline's covered its bars): its entries
    become a line of coloured chips under the title, outside the data, at the scale's size."""
    legend = plot.legend
    if legend is None or not legend.items:
        return
    base = _base(legend, title=plot.titleLabel.text)
    chips = [(f"<span style='color:{_item_color(sample.item)}'>■</span>&nbsp;{label.text}", f"■ {label.text}")
             for sample, label in legend.items]
    plot.__dict__[_CHIPS] = (base["title"], chips, scale)
    plot.setTitle(_chip_title(base["title"], [chips], scale))
    legend.hide()


def _chip_title(title: str, lines: list[list[tuple[str, str]]], scale: float) -> str:
    pt = f"{LABEL_PT * scale:.1f}pt"
    rows = "<br>".join("&nbsp;&nbsp;".join(html for html, _plain in line) for line in lines)
    return (f"{title}<br>" if title else "") + f"<span style='font-size:{pt}'>{rows}</span>"


def _item_color(item) -> str:
    brush = item.opts.get("brush") if hasattr(item, "opts") else None
    if brush is not None and pg.mkBrush(brush).style() != 0:
        return pg.mkBrush(brush).color().name()
    pen = item.opts.get("pen") if hasattr(item, "opts") else None
    return pg.mkPen(pen).color().name() if pen is not None else "#888888"


def _scale_curve(item: pg.PlotDataItem, scale: float) -> None:
    pen = pg.mkPen(item.opts.get("pen"))
    base = _base(item, width=pen.widthF() or 1.0, symbol_size=item.opts.get("symbolSize", 10))
    if item.opts.get("pen") is not None:
        pen.setWidthF(base["width"] * scale)
        item.setPen(pen)
    if item.opts.get("symbol") is not None:
        item.setSymbolSize(base["symbol_size"] * scale)


def _scale_scatter(item: pg.ScatterPlotItem, scale: float) -> None:
    base = _base(item, size=item.opts.get("size", 7))
    item.opts["size"] = base["size"] * scale  # the size of points added from now on (panels set data often)
    sizes = item.data["size"] if len(item.data) else None
    if sizes is not None and (sizes == sizes[0]).all():
        item.setSize(base["size"] * scale)


# --- fitting: wrap titles, shrink axis labels, so nothing is cut ----------------------------------
def fit_texts(root: QWidget, scale: float) -> None:
    """After a repaint: titles wrap at word (or legend chip) boundaries to the width they have and title
    rows take the height they need (also at scale 1: a long title in a narrow dock was cut); at presenter
    scale axis labels also shrink to their axis's length."""
    for plot in plot_items(root):
        _fit_title(plot, max(1.0, scale))
        _fit_title_row(plot)
        if scale <= 1.0:
            continue
        plot.layout.activate()  # the axes get their new lengths before their labels are fitted to them
        for name in ("left", "bottom", "right", "top"):
            _fit_axis_label(plot.getAxis(name), scale)


def _metrics(pt: float) -> QFontMetrics:
    font = QFont()
    font.setPointSizeF(pt)
    return QFontMetrics(font)


def _greedy_lines(items: list, width, room: float, sep: float) -> list[list]:
    lines, current, used = [], [], 0.0
    for item in items:
        w = width(item)
        if current and used + sep + w > room:
            lines.append(current)
            current, used = [], 0.0
        used += (sep if current else 0.0) + w
        current.append(item)
    return lines + ([current] if current else [])


def _fit_title(plot: pg.PlotItem, scale: float) -> None:
    label = plot.titleLabel
    if not label.text or not label.isVisible():
        return
    room = _room(plot, label) - 6
    if room <= 0:
        return
    chips = plot.__dict__.get(_CHIPS)
    if chips is not None:
        title, items, _scale = chips
        m = _metrics(LABEL_PT * scale)
        lines = _greedy_lines(items, lambda it: m.horizontalAdvance(it[1]), room, m.horizontalAdvance("  "))
        text = _chip_title(title, lines, scale)
    else:
        fitted = label.__dict__.get(_FITTED)
        source = fitted[0] if fitted is not None and fitted[1] == label.text else label.text
        if "<" in source:  # other rich text: leave it to the panel
            return
        m = _metrics(TITLE_PT * scale)
        words = source.split(" ")
        lines = _greedy_lines(words, m.horizontalAdvance, room, m.horizontalAdvance(" "))
        text = "<br>".join(" ".join(line) for line in lines)
        label.__dict__[_FITTED] = (source, text)
    if text != label.text:
        label.setText(text)
    _shrink_to(label.item, room, lambda pt: label.setText(label.text, size=f"{pt:.1f}pt"), TITLE_PT * scale)


def _shrink_to(item, room: float, set_pt, pt: float) -> None:
    """A word wider than the room: shrink the font (never below MIN_PT) until the rendered text fits."""
    for _ in range(6):
        width = item.boundingRect().width()
        if width <= room or pt <= MIN_PT:
            return
        pt = max(MIN_PT, pt * room / width * 0.97)
        set_pt(pt)


def _fit_axis_label(axis: pg.AxisItem, scale: float) -> None:
    """Shrink the label (never below MIN_PT) until the rendered text, margins included, fits the axis."""
    if not (axis.isVisible() and axis.label.isVisible() and axis.labelText):
        return
    room = (axis.geometry().height() if axis.orientation in ("left", "right") else axis.geometry().width()) - 2
    if room <= 0:
        return
    pt = LABEL_PT * scale
    for _ in range(6):
        size = f"{pt:.1f}pt"
        if axis.labelStyle.get("font-size") != size:
            axis.labelStyle["font-size"] = size
            axis._updateLabel()
        width = axis.label.boundingRect().width()
        if width <= room or pt <= MIN_PT:
            return
        pt = max(MIN_PT, pt * room / width * 0.97)


# --- the check --------------------------------------------------------------------------------
def _text_width(label: QLabel) -> int:
    text = label.text()
    if label.textFormat() == label.textFormat().RichText or ("<" in text and ">" in text):
        doc = QTextDocument()
        doc.setDefaultFont(label.font())
        doc.setHtml(text)
        doc.setDocumentMargin(0)
        return int(doc.idealWidth())
    fm = QFontMetrics(label.font())
    return max((fm.horizontalAdvance(line) for line in text.splitlines()), default=0)


def _room(plot: pg.PlotItem, item) -> float:
    """The width an item of a plot can show: its own cell, the plot, and the view the plot is seen in
    (a long title widens its cell and the plot beyond the view, where it is cut)."""
    views = plot.scene().views() if plot.scene() is not None else []
    view_w = min((v.viewport().width() for v in views), default=float("inf"))
    return min(item.geometry().width(), plot.geometry().width(), view_w)


def clipped_texts(root: QWidget, slack: int = 2) -> list[str]:
    """Texts in `root` cut by the room they have, as "where: text" lines ([] when all fit). Only what is
    on screen counts: hidden widgets and empty texts are skipped; word-wrapped labels wrap, they are not cut."""
    found = []
    for label in root.findChildren(QLabel):
        if not label.isVisible() or not label.text() or label.wordWrap():
            continue
        if _text_width(label) > label.contentsRect().width() + slack:
            found.append(f"label: {label.text()[:60]}")
    for plot in plot_items(root):
        title = plot.titleLabel
        if title.isVisible() and title.text and title.item.boundingRect().width() > _room(plot, title) + slack:
            found.append(f"plot title: {title.text[:60]}")
        for name in ("left", "bottom", "right", "top"):
            axis = plot.getAxis(name)
            if not (axis.isVisible() and axis.label.isVisible() and axis.labelText):
                continue
            room = axis.geometry().height() if name in ("left", "right") else axis.geometry().width()
            if axis.label.boundingRect().width() > room + slack:
                found.append(f"{name} axis label: {axis.labelText[:60]}")
    return found
