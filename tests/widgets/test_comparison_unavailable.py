"""An unavailable comparison (a managed or attached server) shows its reason alone: the panel's own "not
measured" text was drawn under the overlay's, two texts on top of each other (issue 49, point 1)."""
from __future__ import annotations

from widgets.comparison import ComparisonPanel


def test_the_reason_alone_not_over_the_panels_text(show):
    panel = show(ComparisonPanel(), 500, 400)
    panel.set_available(False, "measured comparisons run the embedded engine")
    assert not panel._scroll.isVisible() and panel.overlay_text().startswith("measured comparisons")
    panel.set_available(True)
    assert panel._scroll.isVisible() and panel.overlay_text() == ""
