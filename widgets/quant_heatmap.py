"""HeatmapView: the quantization-error grid, painted with QPainter (QuantErrorPanel shows it).

One row per decoder layer (layer 0 at the top), one column per projection (qkv, o, gate_up, down: the
kinds present in the report, in the model's order), and a full-width row for the embedding table above
and the lm_head below when they were quantized too (the model's input and output ends). The colour is
the relative weight error on a sequential colormap (viridis) from 0 to the worst matrix, with a colour
bar labelled in percent; hover a cell for its module name and error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from widgets.hover_tips import HoverTips

# The model's projection order; kinds not listed follow in name order.
KIND_ORDER = ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "gate_proj", "up_proj",
              "down_proj")
TOP_ROWS = ("embed_tokens",)  # full-width rows drawn above the layers; other non-layer names go below
_LAYER_NAME = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(?:.*\.)?([^.]+)$")
_MIN_FONT_PT = 6.5
_SPAN_GAP = 4.0  # px between the layer block and the embedding / head rows
_BAR_WIDTH = 12.0


def pct(error: float) -> str:
    """0.0042 -> '0.42 %', 0.021 -> '2.1 %', 0 -> '0 %'."""
    v = 100.0 * error
    if v == 0:
        return "0 %"
    return f"{v:.2f} %" if v < 1 else f"{v:.1f} %"


@dataclass(slots=True)
class Grid:
    """Where each module goes: layer rows x projection columns, plus full-width rows above and below."""

    layers: list[int] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    top: list[str] = field(default_factory=list)
    bottom: list[str] = field(default_factory=list)
    cells: dict[tuple[int, str], str] = field(default_factory=dict)  # (layer, kind) -> module name


def grid_of(names) -> Grid:
    grid = Grid()
    kinds: set[str] = set()
    for name in names:
        m = _LAYER_NAME.match(name)
        if m:
            layer, kind = int(m.group(1)), m.group(2)
            grid.cells[(layer, kind)] = name
            kinds.add(kind)
        else:
            (grid.top if name in TOP_ROWS else grid.bottom).append(name)
    grid.layers = sorted({layer for layer, _ in grid.cells})
    known = [k for k in KIND_ORDER if k in kinds]
    grid.columns = known + sorted(kinds - set(known))
    grid.bottom.sort(key=lambda n: (n != "lm_head", n))
    return grid


def text_color_on(color: QColor) -> QColor:
    """Black on light cells, white on dark ones."""
    luma = 0.299 * color.redF() + 0.587 * color.greenF() + 0.114 * color.blueF()
    return QColor("#000000") if luma > 0.5 else QColor("#ffffff")


class HeatmapView(HoverTips, QWidget):
    """Paints the grid with QPainter; hover a cell for its module name and error."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._cmap = pg.colormap.get("viridis")
        self._errors: dict[str, float] = {}
        self._grid = Grid()
        self._max = 0.0
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumSize(220, 160)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(480, 420)

    def set_errors(self, errors: dict[str, float]) -> None:
        self._errors = dict(errors)
        self._grid = grid_of(self._errors)
        self._max = max(self._errors.values(), default=0.0)
        self.update()

    def color_of(self, error: float) -> QColor:
        t = error / self._max if self._max > 0 else 0.0
        return self._cmap.map(min(1.0, max(0.0, t)), mode="qcolor")

    # --- geometry -----------------------------------------------------------------------------
    def _areas(self) -> tuple[QRectF, QRectF, float]:
        """(grid area, colour bar, row label width) for the current size and font."""
        fm = QFontMetricsF(self.font())
        label_w = max(fm.horizontalAdvance("layer"), fm.horizontalAdvance("00")) + 8
        head_h = fm.height() + 4
        bar_labels = fm.horizontalAdvance(pct(self._max or 0.1)) + 6
        right = _BAR_WIDTH + 8 + bar_labels
        grid = QRectF(label_w, head_h, self.width() - label_w - right - 8, self.height() - head_h - 4)
        bar = QRectF(grid.right() + 8, grid.top(), _BAR_WIDTH, grid.height())
        return grid, bar, label_w

    def _row_height(self, area: QRectF) -> float:
        g = self._grid
        gaps = _SPAN_GAP * (bool(g.top) + bool(g.bottom))
        rows = len(g.layers) + len(g.top) + len(g.bottom)
        return (area.height() - gaps) / max(1, rows)

    def cell_rects(self) -> dict[str, QRectF]:
        """Every module's cell in widget coordinates (gaps between cells excluded)."""
        area, _, _ = self._areas()
        g = self._grid
        rh = self._row_height(area)
        cw = area.width() / max(1, len(g.columns))
        gap = 1.0 if rh >= 4 else 0.0
        rects: dict[str, QRectF] = {}
        y = area.top()
        for name in g.top:
            rects[name] = QRectF(area.left(), y, area.width() - gap, rh - gap)
            y += rh
        y += _SPAN_GAP if g.top else 0.0
        row_of = {layer: i for i, layer in enumerate(g.layers)}
        for (layer, kind), name in g.cells.items():
            rects[name] = QRectF(area.left() + g.columns.index(kind) * cw, y + row_of[layer] * rh, cw - gap, rh - gap)
        y += len(g.layers) * rh + (_SPAN_GAP if g.bottom else 0.0)
        for name in g.bottom:
            rects[name] = QRectF(area.left(), y, area.width() - gap, rh - gap)
            y += rh
        return rects

    def cell_at(self, pos: QPointF) -> str | None:
        """The module whose cell is under `pos` (widget coordinates), or None."""
        p = QPointF(pos)
        return next((name for name, r in self.cell_rects().items() if r.contains(p)), None)

    def tooltip_at(self, pos: QPointF) -> str:
        name = self.cell_at(pos)
        if name is None:
            return ""
        return f"{name}\nrelative weight error ‖W−Ŵ‖/‖W‖ = {pct(self._errors[name])}"

    # --- painting -----------------------------------------------------------------------------
    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        if not self._errors:
            return
        p.setRenderHint(QPainter.RenderHint.TextAntialiasing)
        area, bar, label_w = self._areas()
        rects = self.cell_rects()
        self._paint_labels(p, area, label_w)
        cell_font = self._cell_font(min(r.height() for r in rects.values()))
        for name, r in rects.items():
            color = self.color_of(self._errors[name])
            p.fillRect(r, color)
            self._paint_cell_text(p, r, name, color, cell_font)
        if self._hover in rects:
            p.setPen(QPen(pal.color(QPalette.ColorRole.Text), 2))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRect(rects[self._hover].adjusted(1, 1, -1, -1))
        self._paint_bar(p, bar)

    def _cell_font(self, cell_h: float) -> QFont | None:
        """The widget font, shrunk until a number fits the cell height; None if even the smallest won't."""
        font = QFont(self.font())
        size = font.pointSizeF() if font.pointSizeF() > 0 else 9.0
        while size >= _MIN_FONT_PT:
            font.setPointSizeF(size)
            if QFontMetricsF(font).height() <= cell_h + 1:
                return font
            size -= 0.5
        return None

    def _paint_cell_text(self, p: QPainter, r: QRectF, name: str, color: QColor, font: QFont | None) -> None:
        if font is None:
            return
        text = pct(self._errors[name])
        fm = QFontMetricsF(font)
        if name in self._grid.top or name in self._grid.bottom:
            full = f"{name}  {text}"
            text = full if fm.horizontalAdvance(full) + 6 <= r.width() else text
        if fm.horizontalAdvance(text) + 4 > r.width():
            return
        p.setFont(font)
        p.setPen(text_color_on(color))
        p.drawText(r, Qt.AlignmentFlag.AlignCenter, text)

    def _paint_labels(self, p: QPainter, area: QRectF, label_w: float) -> None:
        fm = QFontMetricsF(self.font())
        p.setFont(self.font())
        p.setPen(self.palette().color(QPalette.ColorRole.Text))
        g = self._grid
        cw = area.width() / max(1, len(g.columns))
        head = QRectF(0, 0, label_w - 4, area.top() - 2)
        p.drawText(head, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom, "layer")
        for i, kind in enumerate(g.columns):
            r = QRectF(area.left() + i * cw, 0, cw, area.top() - 2)
            p.drawText(r, Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom, kind.removesuffix("_proj"))
        rh = self._row_height(area)
        every = next((k for k in (1, 2, 5, 10, 20, 50) if k * rh >= fm.height()), 100)
        y0 = area.top() + len(g.top) * rh + (_SPAN_GAP if g.top else 0.0)
        for i, layer in enumerate(g.layers):
            if layer % every == 0:
                r = QRectF(0, y0 + i * rh + rh / 2 - fm.height() / 2, label_w - 4, fm.height())
                p.drawText(r, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, str(layer))

    def _paint_bar(self, p: QPainter, bar: QRectF) -> None:
        """A vertical colour bar, 0 at the bottom and the worst error at the top, labelled in percent."""
        p.fillRect(bar, self._cmap.getGradient(bar.bottomLeft(), bar.topLeft()))
        pal = self.palette()
        p.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(bar)
        fm = QFontMetricsF(self.font())
        p.setFont(self.font())
        p.setPen(pal.color(QPalette.ColorRole.Text))
        for frac in (0.0, 0.5, 1.0):
            y = bar.bottom() - frac * bar.height()
            p.drawLine(QPointF(bar.right(), y), QPointF(bar.right() + 3, y))
            top = min(max(y - fm.height() / 2, 0.0), self.height() - fm.height())
            r = QRectF(bar.right() + 6, top, self.width() - bar.right() - 6, fm.height())
            p.drawText(r, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, pct(frac * self._max))

    # --- events -------------------------------------------------------------------------------
    def hover_key(self, pos: QPointF) -> str | None:
        return self.cell_at(pos)
