"""ComparisonPanel: a chapter's measured comparison, fed one result dict (app/talk/compare/store.py format).

Shows what was compared, a table (a row per metric, a column per configuration, each value with its
ratio to the first configuration), a chart (bars, or a curve when the knob is numeric with more than
two values), the line "measured <date> on <machine>", and the notes of computed configurations
("computed, not run"). A view: setters and signals only, no torch, no engine but engine.events."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from widgets.comparison_bars import SERIES_COLORS, BarChart
from widgets.comparison_format import (
    check_flag,
    format_value,
    headline_line,
    is_predicted,
    measured_line,
    metric_label,
    mixed_units,
    numeric_knob_values,
    value_with_unit,
)
from widgets.comparison_split import SplitChart
from widgets.comparison_table import fill_table
from widgets.overlay import Overlay

POINT_SIZE = 14  # readable from the back of a room on a projector
COMPACT_POINT_SIZE = 10  # the normal window on a small screen: the chart and the headline first
COMPACT_MIN_WIDTH = 400  # px: a panel growing elsewhere (the latency histograms' text) takes from the others
QWIDGETSIZE_MAX = (1 << 24) - 1  # Qt's "no maximum"
CURVE_MAX_PX = 480  # the curve's height at most when fitted to its panel (pyqtgraph's own size hint)
EMPTY_TEXT = ("not measured on this machine yet: press M to measure it here (about a minute), or run "
              "`inferlab prepare` before the talk")


def _label(point_size: int, bold: bool = False) -> QLabel:
    lab = QLabel()
    lab.setWordWrap(True)  # long titles wrap instead of being cut
    lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    f = QFont(lab.font())
    f.setPointSize(point_size)
    f.setBold(bold)
    lab.setFont(f)
    return lab


class ComparisonPanel(QWidget):
    sigRerunRequested = Signal()  # noqa: N815 (Qt signal naming, as the other panels)
    sigShown = Signal()  # noqa: N815 (a new result is on the panel: its chart may need another height)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._result: dict | None = None
        self.title = _label(POINT_SIZE + 2, bold=True)
        self.provenance = _label(POINT_SIZE - 1)
        self.notes = _label(POINT_SIZE - 1)
        self.flag = _label(POINT_SIZE - 2)  # a result that contradicts its chapter says so first
        self.flag.setStyleSheet("color: #e15759")
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.table.setWordWrap(True)
        f = QFont(self.table.font())
        f.setPointSize(POINT_SIZE)
        self.table.setFont(f)
        self.table.horizontalHeader().setFont(f)
        self.table.verticalHeader().setFont(f)
        self.bars = BarChart(point_size=POINT_SIZE)
        self.curve = pg.PlotWidget()
        self._curve_least = 180
        self.curve.setMinimumHeight(self._curve_least)
        self.split = SplitChart(point_size=POINT_SIZE - 1)
        self.rerun = QPushButton("Measure now (M)")
        self.rerun.setToolTip("run this comparison here, side by side on the same seeded workload")
        self.rerun.clicked.connect(self.sigRerunRequested.emit)
        self.headline = _label(POINT_SIZE, bold=True)  # the compact view: the chapter's number, over its chart
        self.headline.hide()
        self.regime = _label(POINT_SIZE - 2)  # "batch is nearly free up to ~6 here": the machine's regime
        self.regime.hide()
        self.show_table = QPushButton("Table")
        self.show_table.setCheckable(True)
        self.show_table.setToolTip("every metric of every configuration, with its ratio to the first")
        self.show_table.toggled.connect(self._on_table_toggled)
        self.show_table.hide()
        self._compact = False
        head = self._head = QGridLayout()  # title | buttons; compact: the title over its buttons, whole width
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.show_table)
        buttons.addWidget(self.rerun)
        self._buttons = QWidget()
        self._buttons.setLayout(buttons)
        buttons.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.title, 0, 0)
        head.addWidget(self._buttons, 0, 1, Qt.AlignmentFlag.AlignTop)
        head.setColumnStretch(0, 1)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.addLayout(head)
        layout.addWidget(self.flag)
        for w in (self.headline, self.regime, self.provenance, self.table, self.bars, self.curve, self.split,
                  self.notes):
            layout.addWidget(w)
        layout.addStretch(1)
        self._content_layout = layout
        # a short dock scrolls instead of squeezing the table and the chart on top of each other
        scroll = self._scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        self.set_result(None)

    def set_compact(self, on: bool) -> None:
        """The normal window on a small screen (~720 lines): a smaller title, the headline number and the
        chart first, when and where it was measured under it, the table (and the time split) on demand."""
        self._compact = on
        self._head.removeWidget(self._buttons)
        self._head.addWidget(self._buttons, 1 if on else 0, 0 if on else 1, Qt.AlignmentFlag.AlignTop)
        size = COMPACT_POINT_SIZE if on else POINT_SIZE
        for label, pt, bold in ((self.title, size + 1, True), (self.headline, size + 2, True),
                                (self.regime, size - 1, False), (self.provenance, size - 1, False),
                                (self.notes, size - 1, False), (self.flag, size - 1, False)):
            f = QFont(label.font())
            f.setPointSize(pt)
            f.setBold(bold)
            label.setFont(f)
        self.bars.set_point_size(size)
        self.split.set_point_size(size - 1)
        self._table_point_size = size
        self.set_chart_first(on, least_curve=140 if on else None)
        self.setMinimumWidth(COMPACT_MIN_WIDTH if on else 0)  # the proof keeps its column's width
        self.set_result(self._result)

    def _on_table_toggled(self, on: bool) -> None:
        r = self._result
        has_rows = bool(r and not r.get("not_built") and r.get("comparison"))
        self.table.setVisible(has_rows and (on or not self._compact))
        split = has_rows and any(row.get("requests") for row in r.get("comparison", []))
        self.split.setVisible(split and (on or not self._compact))

    def set_chart_first(self, first: bool, least_curve: int | None = None) -> None:
        """Presenter mode: the chart (bars with their numbers) right under the title, when and where it was
        measured and the full table after it, so what a projector shows without scrolling is the picture."""
        layout = self._content_layout
        for w in (self.provenance, self.table):
            layout.removeWidget(w)
        at = layout.indexOf(self.split) + 1 if first else layout.indexOf(self.flag) + 1  # after title + flag
        layout.insertWidget(at, self.provenance)
        layout.insertWidget(at + 1, self.table)
        self._curve_least = least_curve or (120 if first else 180)  # what a 720-line projector has room for
        self.curve.setMinimumHeight(self._curve_least)
        self.curve.setMaximumHeight(QWIDGETSIZE_MAX)  # no height fitted by fit_chart yet

    # --- setters --------------------------------------------------------------------------------
    def set_available(self, available: bool, why: str = "") -> None:
        """Grey the panel out under a message (a source that cannot run measured comparisons)."""
        if not hasattr(self, "_unavailable"):
            self._unavailable = Overlay(self)
        self._unavailable.set_text("" if available else (why or "not available"))
        self._scroll.setVisible(available)  # the message alone: its text was drawn over the panel's own

    def is_available(self) -> bool:
        return not (hasattr(self, "_unavailable") and self._unavailable.text())

    def overlay_text(self) -> str:
        return self._unavailable.text() if hasattr(self, "_unavailable") else ""

    def set_result(self, result: dict | None) -> None:
        """Show one comparison result (None: say there is none yet)."""
        self._result = result
        if not result:
            self.rerun.show()
            self._show_empty(EMPTY_TEXT)
            return
        self.title.setText(result.get("title", ""))
        self.rerun.setVisible(not result.get("not_built"))
        if result.get("not_built"):
            self._show_empty(result["not_built"], keep_title=True)
            return
        rows = result.get("comparison", [])
        flag, flag_details = check_flag(result)
        self.flag.setText(flag)
        self.flag.setToolTip(flag_details)
        self.flag.setVisible(bool(self.flag.text()))
        self.provenance.setText(measured_line(result))
        self.provenance.show()
        self.headline.setText(headline_line(result) if self._compact else "")
        self.headline.setVisible(bool(self.headline.text()))
        self.regime.setText(result.get("regime") or "")
        self.regime.setVisible(bool(self.regime.text()))
        self.show_table.setVisible(self._compact)
        self._fill_table(result, rows)
        self._fill_chart(result, rows)
        split = next((r for r in reversed(rows) if r.get("requests")), None)  # the busiest one, when ran last
        if split is not None:
            self.split.set_requests(f"each request's time at {split['label']}: queue / prefill / decode",
                                    split["requests"])
        self._on_table_toggled(self.show_table.isChecked())
        notes = [f"{r['label']}: {r['note']}" for r in rows if r.get("note")]
        if mixed_units([m for m in result.get("chart", []) if any(m in r["metrics"] for r in rows)]):
            notes.append("chart: each metric on its own scale (a bar's length compares configurations)")
        if any(is_predicted(m) for m in result.get("metrics", [])):
            notes.append("predicted: from a model (bytes to read / memory bandwidth measured by a probe), not run")
        self.notes.setText("\n".join(notes))
        self.notes.setVisible(bool(notes))
        self.sigShown.emit()
        self._fit_compact()

    def chart_height(self) -> int:
        """The panel's height that shows its title, its whole chart (bars, curve, time split) and the
        line saying when and where it was measured, at the panel's present width, without scrolling:
        what presenter mode gives it where the screen allows."""
        self._content_layout.activate()  # the scroll area keeps the content at its width: wrapped to it
        shown = [w for w in (self.bars, self.curve, self.split, self.provenance) if not w.isHidden()]
        bottom = max(w.geometry().y() + max(w.height(), w.minimumHeight()) for w in shown)
        return bottom + self._content_layout.contentsMargins().bottom() + 2

    def fit_chart(self, height: int, grow: bool = True) -> None:
        """Presenter mode: size the curve (the one chart that can take any height) so that the title, the
        whole chart and the "measured" line fit `height` without scrolling, as far as the curve's least
        height allows; a taller panel gives it back up to CURVE_MAX_PX (unless not `grow`)."""
        if self.curve.isHidden():
            return
        spare = height - self.chart_height()
        if spare > 0 and not grow:
            return
        target = max(self._curve_least, min(CURVE_MAX_PX, self.curve.height() + spare))
        if target != self.curve.maximumHeight():
            self.curve.setFixedHeight(target)  # its size hint follows its size: a maximum alone never grows

    def result(self) -> dict | None:
        return self._result

    def snapshot_data(self) -> dict:
        """What the panel shows, as plain data (the CSV export and tests read it)."""
        r = self._result or {}
        return {"title": self.title.text(), "provenance": self.provenance.text(),
                "labels": [row.get("label") for row in r.get("comparison", [])],
                "metrics": list(r.get("metrics", [])), "measured_at": r.get("measured_at"),
                "machine": r.get("machine"), "not_built": r.get("not_built"),
                "flag": self.flag.text() if self.flag.isVisible() else ""}

    def reset(self) -> None:
        self.set_result(None)

    def flush(self) -> None:
        """Nothing pending: the panel repaints only when set_result gives it a new result."""

    def set_repaint_interval(self, ms: int, phase_ms: int = 0) -> None:
        """No repaint timer to pace (the frame governor calls this on every panel)."""

    # --- internals ------------------------------------------------------------------------------
    def _show_empty(self, text: str, keep_title: bool = False) -> None:
        if not keep_title:
            self.title.setText("Comparison")
        self.provenance.setText(text)
        self.provenance.show()
        for w in (self.table, self.bars, self.curve, self.split, self.notes, self.flag, self.headline, self.regime,
                  self.show_table):
            w.hide()
        self.table.setRowCount(0)
        self.table.setColumnCount(0)

    def _fill_table(self, result: dict, rows: list[dict]) -> None:
        t = self.table
        fill_table(t, result, rows, self._table_width(), getattr(self, "_table_point_size", POINT_SIZE))
        t.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        t.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        header = max(t.horizontalHeader().height(), t.horizontalHeader().sizeHint().height())
        height = header + t.verticalHeader().length() + 2 * t.frameWidth() + 4
        t.setMinimumHeight(height)
        t.setMaximumHeight(height)
        self._table_fitted_to = self._table_width()

    def _table_width(self) -> int:
        """The width the table has: the scroll area less the content's margins and a vertical scroll
        bar's width (kept free: a bar that appears later must not cut the last column)."""
        margins = self._content_layout.contentsMargins()
        bar = self._scroll.verticalScrollBar().sizeHint().width()
        inner = self._scroll.width() - 2 * self._scroll.frameWidth() - bar
        return max(100, inner - margins.left() - margins.right())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        r = self._result
        if r and not r.get("not_built") and getattr(self, "_table_fitted_to", None) != self._table_width():
            self._fill_table(r, r.get("comparison", []))  # a narrower dock: compact the table again
            self._on_table_toggled(self.show_table.isChecked())
        self._fit_compact()

    def _fit_compact(self) -> None:
        """The compact window: the curve as tall as the panel allows with the headline and the "measured"
        line in view (down to its least height, then the panel scrolls)."""
        if self._compact and self._result and not self.curve.isHidden():
            self.fit_chart(self._scroll.viewport().height())

    def _fill_chart(self, result: dict, rows: list[dict]) -> None:
        chart = [m for m in result.get("chart", []) if any(m in r["metrics"] for r in rows)]
        mixed = mixed_units(chart)  # one axis cannot carry bytes and tokens/s: bars, each metric its own scale
        xs = None if mixed else numeric_knob_values(result)
        self.bars.setVisible(bool(chart) and xs is None)
        self.curve.setVisible(bool(chart) and xs is not None)
        names = [metric_label(m) for m in chart]
        if xs is None:
            text = value_with_unit if mixed else format_value
            data = [(r["label"] + (" (computed, not run)" if r.get("computed") else ""),
                     [r["metrics"].get(m) for m in chart],
                     [text(m, r["metrics"].get(m)) for m in chart], bool(r.get("computed"))) for r in rows]
            self.bars.set_data(names, data, own_scale=mixed)
            return
        self.curve.clear()
        tick_font = QFont(self.font())
        tick_font.setPointSize((COMPACT_POINT_SIZE if self._compact else POINT_SIZE) - 2)
        for side in ("left", "bottom"):
            self.curve.getAxis(side).setTickFont(tick_font)
        self.curve.getAxis("bottom").setTicks([[(x, f"{x:g}") for x in xs]])  # the knob's own values
        pt = COMPACT_POINT_SIZE if self._compact else POINT_SIZE
        self.curve.setLabel("bottom", result.get("knob", ""), **{"font-size": f"{pt - 1}pt"})
        legend = []
        in_mib = any("bytes" in m.split("_") for m in chart)  # byte counts read better in MiB on an axis
        self.curve.setLabel("left", "MiB" if in_mib else "", **{"font-size": f"{pt - 1}pt"})
        for s, m in enumerate(chart):
            color = SERIES_COLORS[s % len(SERIES_COLORS)]
            scale = 2**-20 if in_mib and "bytes" in m.split("_") else 1.0
            pts = [(x, r["metrics"][m] * scale) for x, r in zip(xs, rows) if m in r["metrics"]]
            style = Qt.PenStyle.DashLine if is_predicted(m) else Qt.PenStyle.SolidLine
            self.curve.plot([p[0] for p in pts], [p[1] for p in pts], pen=pg.mkPen(color, width=3, style=style),
                            symbol="o", symbolSize=10, symbolBrush=color)
            legend.append(f'<span style="color:{color}">■ {names[s]}</span>')
        self.curve.setTitle("   ".join(legend), size=f"{pt}pt")  # the legend above the data
