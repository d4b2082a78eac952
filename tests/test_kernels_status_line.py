"""Issue 24 point 6: while the native kernels build in the background the status bar says so, and it
changes by itself once they are built and take over (before: it named the tier from the first frame on)."""
from __future__ import annotations

from app_helpers import close_window, open_window, wait_until
from PySide6.QtWidgets import QApplication

import engine.kernels as kernels
from app.source import channel


def test_the_status_bar_says_building_then_follows_the_kernels(qapp, tiny_llama, monkeypatch):
    building = {"now": True}
    monkeypatch.setattr(kernels, "build_pending", lambda tier=None: building["now"])
    window = open_window(tiny_llama)
    app = QApplication.instance()
    try:
        tier = kernels.cpu_tier()
        assert f"{tier} kernels building" in window.engine_label.text()
        assert "building" in window.engine_label.toolTip()  # the long line: torch's kernels meanwhile
        published = []
        real_publish = window.host.publish
        monkeypatch.setattr(window.host, "publish", lambda item: (published.append(item), real_publish(item)))
        building["now"] = False  # the build is done: the next snapshot sees it
        wait_until(app, lambda: any(isinstance(i, channel.ComputeChanged) for i in published), 20.0)
        wait_until(app, lambda: "building" not in window.engine_label.text(), 10.0)
        assert f"{tier} kernels" in window.engine_label.text()
        assert window.host.info.compute_short == window.host.engine.compute_line(short=True)
    finally:
        close_window(window)
