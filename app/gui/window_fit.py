"""The window on the screen it opens on: its size clamped to the screen's available geometry (a 1600 x 1000
window on a 1280 x 720 screen hid the caption's end, the memory and latency panels and the status bar),
the compact arrangement of the docks below COMPACT_HEIGHT lines, and the layout kept per screen size (a
layout saved on a large monitor is not restored onto a projector's 720 lines)."""
from __future__ import annotations

from PySide6.QtCore import QRect
from PySide6.QtWidgets import QApplication, QMainWindow

DEFAULT_SIZE = (1600, 1000)
COMPACT_HEIGHT = 900  # screens with fewer available lines get the compact arrangement (window_docks.py)


def available_size(window: QMainWindow, given: tuple[int, int] | None = None) -> tuple[int, int]:
    """The room the window has: `given` (a headless screenshot's --size stands for a screen of that
    size), else the available geometry of the screen it opens on (the desktop less panels and docks)."""
    if given:
        return int(given[0]), int(given[1])
    screen = window.screen() or QApplication.primaryScreen()
    if screen is None or QApplication.platformName() == "offscreen":  # no real screen: its 800 x 600 is Qt's
        return DEFAULT_SIZE
    room = screen.availableGeometry()
    return room.width(), room.height()


def fitted(size: tuple[int, int], room: tuple[int, int]) -> tuple[int, int]:
    return min(size[0], room[0]), min(size[1], room[1])


def layout_key(room: tuple[int, int]) -> str:
    """The settings group a layout is kept under: one per screen size."""
    return f"layout/{room[0]}x{room[1]}"


def keep_on_screen(window: QMainWindow, room: tuple[int, int]) -> None:
    """After a restored geometry: no larger than the room, and inside the screen's available area."""
    w, h = fitted((window.width(), window.height()), room)
    if (w, h) != (window.width(), window.height()):
        window.resize(w, h)
    screen = window.screen() or QApplication.primaryScreen()
    if screen is None:
        return
    area: QRect = screen.availableGeometry()
    if area.width() < room[0] or area.height() < room[1]:  # a given size larger than this (offscreen) screen
        return
    frame = window.frameGeometry()
    x = min(max(frame.x(), area.left()), area.right() - frame.width() + 1)
    y = min(max(frame.y(), area.top()), area.bottom() - frame.height() + 1)
    if (x, y) != (frame.x(), frame.y()):
        window.move(x, y)
