"""Presenter mode's arrangement of the window: which docks a projector shows, side by side in columns,
and how much of its column the measured comparison gets (its whole chart where the screen allows).

Sizes follow the projector's lines: a 720-line picture is projected as large as a 1080-line one, so each
of its pixels is larger: it needs less enlarging, and has less room. pyqtgraph's fonts are smaller than
Qt's to start with.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow

PRESENTER_FONT_SCALE = {720: 1.15, 1080: 1.4}
PRESENTER_PLOT_SCALE = {720: 1.25, 1080: 1.6}
PRESENTER_COMPARISON_SHARE = 0.3  # of the screen's height, at least: the measured proof keeps its chart
COMPARISON_MAX_SHARE = 0.7  # of its column, at most: the live panel above it keeps some room
RESIZE_SLACK_PX = 6  # closer than this to its target, the comparison's dock is left where it is
MIN_COLUMN_PX = 400  # narrowest column the comparison moves into when its own column has no room for it


def presenter_scale(table: dict[int, float], screen_height: int) -> float:
    lo, hi = table[720], table[1080]
    t = min(1.0, max(0.0, (screen_height - 720) / 360))
    return lo + t * (hi - lo)


def arrange_columns(window: QMainWindow, docks: list[QDockWidget]) -> list[list[QDockWidget]]:
    """The chapter's main panel on the left; with four or more, a second column beside it; the next one
    on the right; each further one (the comparison, listed last) under the column that needs the least
    height, so the tallest column still fits a 720-line projector. Returns the columns, top to bottom."""
    left = Qt.DockWidgetArea.LeftDockWidgetArea
    window.addDockWidget(left, docks[0])
    columns = [[docks[0]]]
    rest = docks[1:]
    if len(docks) >= 4:
        window.splitDockWidget(docks[0], docks[1], Qt.Orientation.Horizontal)
        columns.append([docks[1]])
        rest = docks[2:]
    if rest:
        window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, rest[0])  # out of any tab group
        columns.append([rest[0]])
    for dock in rest[1:]:
        column = min(columns, key=lambda c: sum(d.minimumSizeHint().height() for d in c))
        window.splitDockWidget(column[-1], dock, Qt.Orientation.Vertical)
        column.append(dock)
    for dock in docks:
        dock.show()
    if len(columns) > 1:
        width = max(1, window.width() // len(columns))
        window.resizeDocks([c[0] for c in columns], [width] * len(columns), Qt.Orientation.Horizontal)
    return columns


def give_comparison_room(window: QMainWindow, columns: list[list[QDockWidget]], dock: QDockWidget) -> None:
    """Size the comparison's dock to the height that shows its whole chart (the panel's chart_height),
    taking it from the docks above it in its column down to the height their text needs now (it grows
    once the engine reports), and to at most COMPARISON_MAX_SHARE of the column: the proof on a 720-line
    projector, not its first bar. Where that is less than its chart needs, the comparison takes a column
    of its own if the window is wide enough. Called again as texts change; moves nothing for a few pixels."""
    column = next((c for c in columns if dock in c), None)
    if column is None or not dock.isVisible():
        return
    panel = dock.widget()
    if len(column) < 2:  # a column of its own: its height is the screen's; the curve fits itself to it
        panel.fit_chart(panel.height())
        return
    chrome = dock.height() - panel.height()  # the dock's title bar and frame
    total = sum(d.height() for d in column)
    others = [d for d in column if d is not dock]
    floors = [_least_height(d) for d in others]
    room = min(total - sum(floors), int(COMPARISON_MAX_SHARE * total))
    need = panel.chart_height() + chrome
    if need > room:  # a shorter curve first; then a column of its own
        panel.fit_chart(room - chrome, grow=False)
        need = panel.chart_height() + chrome
        if need > room and _own_column(window, columns, dock):
            return
    want = min(need, room)
    want = max(want, dock.minimumSizeHint().height())
    if abs(want - dock.height()) < RESIZE_SLACK_PX:
        return
    left = total - want
    current = sum(d.height() for d in others) or 1
    sizes = [max(floor, int(left * d.height() / current)) for d, floor in zip(others, floors, strict=True)]
    window.resizeDocks(others + [dock], sizes + [want], Qt.Orientation.Vertical)


def _own_column(window: QMainWindow, columns: list[list[QDockWidget]], dock: QDockWidget) -> bool:
    """Move the comparison out of a column that cannot show its whole chart into a column of its own on
    the right, where the window is wide enough for one more (a 720-line projector with two columns).
    Returns whether it moved."""
    if window.width() // (len(columns) + 1) < MIN_COLUMN_PX:
        return False
    column = next(c for c in columns if dock in c)
    column.remove(dock)
    window.splitDockWidget(columns[-1][0], dock, Qt.Orientation.Horizontal)
    columns.append([dock])
    width = window.width() // len(columns)
    window.resizeDocks([c[0] for c in columns], [width] * len(columns), Qt.Orientation.Horizontal)
    return True


def _least_height(dock: QDockWidget) -> int:
    """The least height a dock's panel takes without squeezing its text: its labels wrapped at the
    dock's width (a dock area takes only minimum sizes, which do not know that wrapped text is taller)."""
    panel, least = dock.widget(), dock.minimumSizeHint().height()
    layout = panel.layout() if panel is not None else None
    if layout is not None and layout.hasHeightForWidth():
        least = max(least, layout.totalMinimumHeightForWidth(panel.width()) + dock.height() - panel.height())
    return least
