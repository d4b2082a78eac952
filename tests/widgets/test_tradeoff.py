"""TradeoffPanel: cost math, hollow unmeasured points, the current point, price edits, sweep button."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from widget_fakes import tradeoff_points

from engine.events import TradeoffPoint
from widgets.tradeoff import NOT_MEASURED, TradeoffPanel, cost_per_million_tokens


@pytest.fixture
def panel(show):
    return show(TradeoffPanel(), 700, 500)


def test_cost_math():
    # $3.60 per hour at 1000 tok/s = 3.6M tokens per hour -> $1 per million
    assert cost_per_million_tokens(3.60, 1000.0) == pytest.approx(1.0)
    assert cost_per_million_tokens(2.50, 500.0) == pytest.approx(2.50 / (500 * 3600) * 1e6)
    assert cost_per_million_tokens(2.50, 0.0) is None


def test_points_cost_and_quality(panel):
    for p in tradeoff_points():
        panel.add_point(p)
    panel.set_current("bits=8 batch=32")
    panel.flush()
    data = panel.snapshot_data()
    assert data["num_points"] == 5 and data["current"] == "bits=8 batch=32" and data["empty_text"] == ""
    by_label = {p["label"]: p for p in data["points"]}
    assert by_label["bits=16 batch=8"]["cost_per_million_tokens"] == pytest.approx(2.5 / (320 * 3600) * 1e6)
    assert by_label["bits=4 batch=64"]["hollow"] and not by_label["bits=4 batch=32"]["hollow"]
    assert NOT_MEASURED in panel._labels["bits=4 batch=64"].textItem.toPlainText()
    spots = {s.data(): s for s in panel._scatter.points()}
    assert spots["bits=4 batch=64"].brush().style() == Qt.BrushStyle.NoBrush  # hollow
    assert spots["bits=4 batch=32"].brush().style() != Qt.BrushStyle.NoBrush
    ring_x, ring_y = panel._ring.getData()
    assert list(ring_x) == [31.0] and ring_y[0] == pytest.approx(2.5 / (990 * 3600) * 1e6)


def test_price_change_recomputes_and_emits(panel, qtbot):
    panel.add_point(TradeoffPoint("a", {}, 10.0, 1000.0, 0.0))
    with qtbot.waitSignal(panel.sigPriceChanged, timeout=1000) as blocker:
        panel.set_price_per_hour(7.20)
    assert blocker.args == [pytest.approx(7.2)]
    panel.flush()
    assert panel.snapshot_data()["points"][0]["cost_per_million_tokens"] == pytest.approx(2.0)
    assert panel._scatter.getData()[1][0] == pytest.approx(2.0)


def test_same_label_replaces_and_clear(panel):
    panel.add_point(TradeoffPoint("a", {}, 10.0, 1000.0, None))
    panel.add_point(TradeoffPoint("a", {}, 12.0, 1100.0, 1.0))
    panel.flush()
    assert panel.snapshot_data()["num_points"] == 1
    panel.clear()
    assert panel.snapshot_data()["num_points"] == 0 and "Run sweep" in panel.snapshot_data()["empty_text"]
    assert not panel._labels


def test_sweep_button(panel, qtbot):
    with qtbot.waitSignal(panel.sigSweep, timeout=1000):
        qtbot.mouseClick(panel._sweep, Qt.MouseButton.LeftButton)
