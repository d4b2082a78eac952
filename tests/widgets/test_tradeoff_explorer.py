"""The explorer (issue 49, point 6): after applying a sweep point the "current" ring stays on it while the
live point is measured, the gap between them is said with a button that runs the sweep's load, the
predicted 7B/70B squares can be hidden (they squashed the measured points), Run sweep has S."""
from __future__ import annotations

import pytest
from test_tradeoff import _sweep

from engine.events import TradeoffPoint
from widgets.tradeoff import TradeoffPanel
from widgets.tradeoff_points import sweep_label


@pytest.fixture
def panel(show):
    p = show(TradeoffPanel(), 700, 500)
    p.set_sweep(_sweep())
    p.flush()
    return p


def _click(panel, label: str) -> None:
    class Spot:
        def data(self):
            return label
    panel._on_clicked(None, [Spot()])


def test_the_ring_moves_to_an_applied_point_and_the_gap_is_said(panel, qtbot):
    target = sweep_label({"batch": 8, "bits": 16, "draft": 0})
    with qtbot.waitSignal(panel.sigApply) as applied:
        _click(panel, target)
    assert applied.args[0] == {"max_num_seqs": 8, "quant_bits": 16, "num_speculative_tokens": 0}
    panel.flush()
    assert panel.snapshot_data()["current"] == target
    live = TradeoffPoint(label="batch 8 · budget 512 · 1 req/s", config={"max_num_seqs": 8, "arrival_rate": 1.0},
                         tokens_per_s_per_user=20.0, total_tokens_per_s=25.0, perplexity_delta_pct=None)
    panel.add_point(live)
    panel.set_current(live.label)  # what the feeder does with each live point
    panel.flush()
    assert panel.snapshot_data()["current"] == target  # the ring stays on the applied point
    assert panel._gap.isVisibleTo(panel) and "8 requests always in flight" in panel._gap.text()
    assert "arrivals at 1 req/s" in panel._gap.text() and "x the live 25" in panel._gap.text()
    with qtbot.waitSignal(panel.sigSweepLoad) as load:
        panel._sweep_load.click()
    assert load.args == [8]
    panel.set_applied(None)  # a slider moved: the ring follows the live configuration again
    panel.flush()
    assert panel.snapshot_data()["current"] == live.label and not panel._gap.isVisibleTo(panel)


def test_the_predicted_squares_can_be_hidden(panel):
    assert len(panel._positions()) == 18 + 3
    panel._show_predicted.setChecked(False)
    panel.flush()
    assert len(panel._positions()) == 18
    ys = [y for _x, y in panel._positions().values()]
    assert max(ys) / min(ys) < 1e3  # the axes fit the measured points alone


def test_run_sweep_has_a_key():
    from app.gui.keys import KEYS

    assert ("S" in dict(KEYS)) and "sweep" in dict(KEYS)["S"]
