"""A painted horizontal bar chart: one row per configuration, its full label on the left (wrapped,
never elided), one bar per charted metric, the value written at the bar's end. Metrics of one unit share
one scale (measured vs predicted tokens/s, TTFT vs end-to-end ms), so their lengths compare; metrics of
different units (bytes beside tokens/s beside perplexity) each get their own (`own_scale`): a bar's length
then compares configurations within its metric, and its number carries the unit. A legend sits above
the rows, outside the data."""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

SERIES_COLORS = ("#5b8def", "#f29900", "#81c995", "#f28b82")
COMPUTED_ALPHA = 110  # computed (not run) bars are drawn translucent and hatched


class BarChart(QWidget):
    def __init__(self, parent: QWidget | None = None, point_size: int = 14) -> None:
        super().__init__(parent)
        self._rows: list[tuple[str, list[float | None], list[str], bool]] = []
        self._series: list[str] = []
        self._own_scale = False
        self._font = QFont(self.font())
        self._font.setPointSize(point_size)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_point_size(self, point_size: int) -> None:
        self._font.setPointSize(point_size)
        self.setFixedHeight(self._needed_height())
        self.update()

    def set_data(self, series: list[str], rows: list[tuple[str, list[float | None], list[str], bool]],
                 own_scale: bool = False) -> None:
        """series: legend names; rows: (label, one value per series, its text, computed); own_scale: each
        series scaled to its own largest value (metrics of different units)."""
        self._series, self._rows, self._own_scale = list(series), list(rows), own_scale
        self.setFixedHeight(self._needed_height())
        self.update()

    def _tops(self) -> list[float]:
        """The value a full-length bar stands for, per series: one for all, or each its own."""
        def largest(series: range) -> float:
            return max((abs(r[1][s]) for r in self._rows for s in series if r[1][s] is not None), default=0.0)
        n = len(self._series)
        if self._own_scale:
            return [largest(range(s, s + 1)) for s in range(n)]
        return [largest(range(n))] * n

    def _line(self) -> int:
        return QFontMetrics(self._font).height()

    def _label_width(self, fm: QFontMetrics, w: int) -> int:
        return min(int(w * 0.34), max((fm.horizontalAdvance(r[0]) for r in self._rows), default=0) + 12)

    @staticmethod
    def _wrap_flag(fm: QFontMetrics, label: str, width: int):
        """Wrap between words; anywhere only when one word is wider than the column."""
        fits = all(fm.horizontalAdvance(word) <= width for word in label.split())
        return Qt.TextFlag.TextWordWrap if fits else Qt.TextFlag.TextWrapAnywhere

    def _labels_above(self, fm: QFontMetrics, w: int) -> bool:
        """Labels go on their own line above their bars (full width) where the label column would wrap
        one of them onto more than two lines, or break a word ("torch.compil" / "e"): a narrow panel
        (presenter mode, or the compact window at 720 lines) keeps its rows short and its bars long."""
        label_w = max(20, self._label_width(fm, w) - 8)
        return any(self._label_height(fm, r[0], label_w) > 2.5 * fm.height()
                   or self._wrap_flag(fm, r[0], label_w) != Qt.TextFlag.TextWordWrap for r in self._rows)

    def _label_height(self, fm: QFontMetrics, label: str, width: int) -> int:
        return fm.boundingRect(0, 0, width, 10_000, self._wrap_flag(fm, label, width)
                               | Qt.AlignmentFlag.AlignLeft, label).height()

    def _row_heights(self, w: int) -> list[int]:
        """Each row: its bars, or its label wrapped into the label column (at any character when one word
        is wider than the column), whichever is taller; or, labels above, the label and then the bars: a
        label is never cut."""
        fm = QFontMetrics(self._font)
        bars = max(2, len(self._series)) * self._line() + 8
        if self._labels_above(fm, w):
            bars = len(self._series) * self._line() + 8
            return [self._label_height(fm, r[0], w) + bars for r in self._rows]
        label_w = max(20, self._label_width(fm, w) - 8)
        return [max(bars, self._label_height(fm, r[0], label_w) + 8) for r in self._rows]

    def _legend(self, fm: QFontMetrics, w: int) -> list[tuple[int, int]]:
        """(x, line) of each legend entry: on one line, wrapping to the next where the width ends."""
        out, x, row = [], 0, 0
        for name in self._series:
            width = self._line() + fm.horizontalAdvance(name) + 24
            if x and x + width - 24 > w:
                x, row = 0, row + 1
            out.append((x, row))
            x += width
        return out

    def _legend_height(self, fm: QFontMetrics, w: int) -> float:
        lines = max((row for _x, row in self._legend(fm, w)), default=0) + 1
        return self._line() * (lines + 0.6)

    def _needed_height(self) -> int:
        w = max(self.width(), 100)
        return int(self._legend_height(QFontMetrics(self._font), w) + self._line() * 0.4
                   + sum(self._row_heights(w)) + 8)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        height = self._needed_height()
        if height != self.height():
            self.setFixedHeight(height)

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setFont(self._font)
        fm, text_color = QFontMetrics(self._font), self.palette().text().color()
        line, w = self._line(), self.width()
        above = self._labels_above(fm, w)
        label_w = 0 if above else self._label_width(fm, w)
        for i, (name, (x, row)) in enumerate(zip(self._series, self._legend(fm, w))):  # legend, above the data
            top, color = row * line, QColor(SERIES_COLORS[i % len(SERIES_COLORS)])
            p.fillRect(QRectF(x, top + line * 0.2, line * 0.8, line * 0.8), color)
            p.setPen(text_color)
            p.drawText(QRectF(x + line, top, w - x, line), Qt.AlignmentFlag.AlignLeft, name)
        tops = self._tops()
        value_w = max((fm.horizontalAdvance(t) for r in self._rows for t in r[2]), default=0) + 12
        bar_w = max(10, w - label_w - value_w)
        y = self._legend_height(fm, w)
        for (label, values, texts, computed), per_row in zip(self._rows, self._row_heights(w), strict=True):
            p.setPen(text_color)
            if above:
                label_h = self._label_height(fm, label, w)
                p.drawText(QRectF(0, y, w, label_h), Qt.AlignmentFlag.AlignLeft | self._wrap_flag(fm, label, w), label)
            else:
                label_h = 0
                p.drawText(QRectF(0, y, label_w - 8, per_row - 4),
                           Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
                           | self._wrap_flag(fm, label, int(label_w - 8)), label)
            for s, (v, t) in enumerate(zip(values, texts)):
                by = y + label_h + s * line + 2
                length = bar_w * abs(v) / tops[s] if v is not None and tops[s] else 0
                color = QColor(SERIES_COLORS[s % len(SERIES_COLORS)])
                if computed:
                    color.setAlpha(COMPUTED_ALPHA)
                p.fillRect(QRectF(label_w, by, length, line - 4), color)
                if computed:
                    p.fillRect(QRectF(label_w, by, length, line - 4), Qt.BrushStyle.BDiagPattern)
                p.setPen(text_color)
                p.drawText(QRectF(label_w + length + 6, by - 2, value_w, line), Qt.AlignmentFlag.AlignLeft, t)
            y += per_row
        p.end()
