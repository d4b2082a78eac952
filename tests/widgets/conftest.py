"""Widget tests run headless: force the offscreen platform before Qt is imported anywhere."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture
def show(qtbot):
    """Add a widget to qtbot, give it a size, show it and wait until it is exposed."""

    def _show(widget, width: int = 800, height: int = 600):
        qtbot.addWidget(widget)
        widget.resize(width, height)
        widget.show()
        qtbot.waitExposed(widget)
        return widget

    return _show
