"""The comparison's table (a row per metric, a column per configuration), fitted to the width it has: a
projector's 1280 px shows every column whole. Where the plain table is wider than its panel, each
value's ratio goes under it, column and metric labels wrap between words to the width of their values,
and then the font steps down (at most MAX_SHRINK_PT) until the columns fit. No column is ever cut."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem

from widgets.comparison_format import format_value, is_predicted, metric_label, ratio_text
from widgets.line_labels import wrap_words  # the same greedy breaks between words

MAX_SHRINK_PT = 4
CELL_PAD_PX = 24  # a cell's margins and the header's sort/section padding, as Qt draws them


def _wrap_label(label: str, fm: QFontMetrics, px: int) -> str:
    """Between words, and after the underscores of a knob's name ("max_num_" / "seqs = 8")."""
    return wrap_words(label.replace("_", "_ "), fm, px).replace("_ ", "_")


def needed_width(t: QTableWidget) -> int:
    return t.horizontalHeader().length() + t.verticalHeader().sizeHint().width() + 2 * t.frameWidth() + 2


def fill_table(t: QTableWidget, result: dict, rows: list[dict], width: int, point_size: int) -> None:
    """Fill `t` and fit it to `width` px (the panel's): plain first, then compact, then smaller fonts."""
    for size in range(point_size, point_size - MAX_SHRINK_PT - 1, -1):
        for compact in (False, True):
            if size < point_size and not compact:
                continue
            _fill(t, result, rows, size, compact)
            if needed_width(t) <= width:
                return


def _fill(t: QTableWidget, result: dict, rows: list[dict], point_size: int, compact: bool) -> None:
    f = QFont(t.font())
    f.setPointSize(point_size)
    for target in (t, t.horizontalHeader(), t.verticalHeader()):
        target.setFont(f)
    fm = QFontMetrics(f)
    metrics = result.get("metrics", [])
    t.setRowCount(len(metrics))
    t.setColumnCount(len(rows))
    cells = [[_cell_text(m, r, rows, j, compact) for j, r in enumerate(rows)] for m in metrics]
    headers = []
    for j, r in enumerate(rows):
        label = r["label"] + (" (computed, not run)" if r.get("computed") else "")
        widest = max((fm.horizontalAdvance(line) for row in cells for line in row[j].split("\n")), default=0)
        headers.append(_wrap_label(label, fm, max(widest, fm.horizontalAdvance("computed,"))) if compact
                       else label.replace(" (computed, not run)", "\n(computed, not run)"))
    t.setHorizontalHeaderLabels(headers)
    names = [metric_label(m) for m in metrics]
    t.setVerticalHeaderLabels([wrap_words(n, fm, fm.horizontalAdvance("x" * 14)) if compact else n for n in names])
    for i, m in enumerate(metrics):
        for j, r in enumerate(rows):
            item = QTableWidgetItem(cells[i][j])
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setToolTip(result.get("metric_info", {}).get(m, m))
            if r.get("computed") or is_predicted(m):
                italic = item.font()
                italic.setPointSize(point_size)
                italic.setItalic(True)
                item.setFont(italic)
            t.setItem(i, j, item)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.resizeColumnsToContents()
    t.resizeRowsToContents()


def _cell_text(metric: str, row: dict, rows: list[dict], j: int, compact: bool) -> str:
    v = row["metrics"].get(metric)
    ratio = ratio_text(v, rows[0]["metrics"].get(metric)) if j else ""
    if not ratio:
        return format_value(metric, v)
    return format_value(metric, v) + ("\n" if compact else "  ") + f"({ratio})"
