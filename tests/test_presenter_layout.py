"""Presenter layout: the measured comparison gets the height its whole chart needs, from the panel
above it, down to the height that panel's wrapped text needs; never past either; and where that is not
enough and the window is wide enough, a column of its own."""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QVBoxLayout, QWidget

from app.gui.presenter_layout import COMPARISON_MAX_SHARE, MIN_COLUMN_PX, arrange_columns, give_comparison_room
from widgets.comparison import ComparisonPanel

sys.path.insert(0, str(Path(__file__).parent / "widgets"))
from test_comparison import _result  # noqa: E402 (the widget tests' synthetic result)


def _texts(n: int) -> QWidget:
    w = QWidget()
    layout = QVBoxLayout(w)
    for i in range(n):
        label = QLabel(f"line {i}: " + "a long wrapped sentence about memory " * 3)
        label.setWordWrap(True)
        layout.addWidget(label)
    layout.addStretch(1)
    return w


def _window(qtbot, above: QWidget, right: QWidget | None = None,
            width: int = 1280) -> tuple[QMainWindow, list[QDockWidget]]:
    win = QMainWindow()
    qtbot.addWidget(win)
    win.setDockNestingEnabled(True)
    win.setCentralWidget(QWidget())
    win.centralWidget().setMaximumSize(0, 0)
    docks = []
    for name, widget in (("above", above), ("right", right or _texts(1)), ("comparison", ComparisonPanel())):
        dock = QDockWidget(name)
        dock.setObjectName(name)
        dock.setWidget(widget)
        docks.append(dock)
    win.resize(width, 720)
    win.show()
    qtbot.waitExposed(win)
    return win, docks


def test_the_comparison_gets_its_chart_height(qtbot):
    win, docks = _window(qtbot, _texts(2))
    columns = arrange_columns(win, docks)
    comparison = docks[2].widget()
    comparison.set_chart_first(True)
    comparison.set_result(_result())
    qtbot.wait(100)
    before = docks[2].height()
    give_comparison_room(win, columns, docks[2])
    qtbot.wait(100)
    column = next(c for c in columns if docks[2] in c)
    assert docks[2].height() > before
    share = COMPARISON_MAX_SHARE * sum(d.height() for d in column)
    assert comparison.height() >= min(comparison.chart_height(), share) - 8


def _squeezed(qtbot, width: int):
    """A comparison under a panel of much wrapped text (it cannot have all it wants there)."""
    above = _texts(14)
    win, docks = _window(qtbot, above, right=_texts(18), width=width)  # the other column needs more
    columns = arrange_columns(win, docks)
    assert [docks[0], docks[2]] in columns
    comparison = docks[2].widget()
    comparison.set_chart_first(True)
    comparison.set_result(_result())
    qtbot.wait(100)
    give_comparison_room(win, columns, docks[2])
    qtbot.wait(100)
    return win, docks, columns, above, comparison


def test_the_panel_above_keeps_the_height_its_text_needs(qtbot):
    width = 3 * MIN_COLUMN_PX - 30  # no room for a third column
    win, docks, columns, above, comparison = _squeezed(qtbot, width)
    assert len(columns) == 2
    need = above.layout().totalMinimumHeightForWidth(above.width())
    assert above.height() >= need - 2
    assert comparison.height() < comparison.chart_height()  # it wanted more than there was


def test_a_squeezed_comparison_takes_a_column_of_its_own_where_wide_enough(qtbot):
    win, docks, columns, above, comparison = _squeezed(qtbot, 1280)
    assert columns[-1] == [docks[2]] and [docks[0]] in columns
    assert docks[2].x() > max(docks[0].x(), docks[1].x())  # on the right
    assert comparison.height() >= comparison.chart_height() - 8  # its whole chart, no scrolling
    need = above.layout().totalMinimumHeightForWidth(above.width())
    assert above.height() >= need - 2

