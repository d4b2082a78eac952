"""LatencyPanel: percentiles on known inputs, histograms, tokens/s, goodput against a budget."""
from __future__ import annotations

import numpy as np
import pytest

from engine.events import RequestTimeline, StepStats
from widgets.latency_panel import LatencyPanel, latency_percentiles


@pytest.fixture
def panel(show):
    return show(LatencyPanel(window_s=30.0, rate_window_s=5.0), 900, 400)


def timeline(i: int, arrival: float, ttft: float | None, tpot: float, n_out: int = 11) -> RequestTimeline:
    first = None if ttft is None else arrival + ttft
    finished = arrival + (ttft or 0.0) + tpot * (n_out - 1)
    return RequestTimeline(f"r{i}", arrival, 10, first_scheduled=arrival, first_token=first, finished=finished,
                           num_output_tokens=n_out, finish_reason="stop" if ttft is not None else "rejected")


def test_percentiles_known_values():
    p = latency_percentiles(range(1, 101))
    assert p == {50: pytest.approx(50.5), 95: pytest.approx(95.05), 99: pytest.approx(99.01)}
    assert latency_percentiles([]) is None
    assert latency_percentiles([0.25]) == {50: 0.25, 95: 0.25, 99: 0.25}


def test_histograms_and_percentile_lines(panel):
    for i in range(100):  # TTFT 10 ms .. 1000 ms, TPOT 20 ms
        panel.add_finished(timeline(i, arrival=float(i) * 0.1, ttft=(i + 1) / 100, tpot=0.02))
    panel.flush()
    p = panel.snapshot_data()["percentiles"]
    assert p["ttft"][50] == pytest.approx(0.505) and p["ttft"][99] == pytest.approx(0.9901)
    assert p["tpot"][95] == pytest.approx(0.02)
    assert panel._lines["ttft"][50].value() == pytest.approx(505.0)  # drawn in ms
    assert panel._labels["ttft"].text().startswith("p50 505 ms · p95 950 ms · p99 990 ms")
    x, y = panel._hists["ttft"].getData()
    assert y.sum() == 100


def test_goodput_and_tokens_per_second(panel):
    # 10 requests finishing within 10 s: 6 meet TTFT <= 0.5 s and TPOT <= 50 ms, 1 is rejected
    ttfts = [0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.9, 1.2, 0.2, None]
    tpots = [0.01, 0.02, 0.03, 0.04, 0.05, 0.01, 0.01, 0.01, 0.2, 0.01]
    for i, (ttft, tpot) in enumerate(zip(ttfts, tpots)):
        panel.add_finished(timeline(i, arrival=float(i), ttft=ttft, tpot=tpot, n_out=2))
    for s in range(100):  # steps of 0.1 s, 50 tokens each, from t = 0 to t = 10
        panel.add_step(StepStats(step=s, t_start=s * 0.1, wall_time_s=0.1, num_prefill_tokens=20,
                                 num_decode_tokens=30, num_running=4, num_waiting=0, num_preempted=0,
                                 kv_blocks_used=1, kv_blocks_total=10))
    panel.set_budget(0.5, 0.05)
    panel.flush()
    data = panel.snapshot_data()
    assert data["num_within_budget"] == 6 and data["num_in_window"] == 10
    assert data["goodput_rps"] == pytest.approx(6 / 10.0)
    assert data["total_tokens_per_s"] == pytest.approx(500.0)
    assert "goodput <b>0.6 req/s</b> (60% of 10)" in data["summary"]
    assert panel._lines["ttft"]["budget"].isVisible() and panel._lines["ttft"]["budget"].value() == 500


def test_no_budget_and_reset(panel):
    panel.flush()
    assert "no latency budget set" in panel.snapshot_data()["summary"]
    assert panel._labels["ttft"].text() == "no finished requests yet"
    panel.add_finished(timeline(0, 0.0, 0.1, 0.01))
    panel.reset()
    assert panel.snapshot_data()["num_finished"] == 0


def test_values_skip_missing():
    panel = LatencyPanel()
    panel.add_finished(timeline(0, 0.0, None, 0.01))
    panel.add_finished(timeline(1, 0.0, 0.2, 0.01))
    assert panel.values("ttft") == [pytest.approx(0.2)]
    assert np.isclose(panel.values("e2e"), [0.1, 0.3]).all()
    panel.deleteLater()


def test_line_labels_apart_and_inside_when_percentiles_crowd(panel, qtbot):
    """TPOT all alike: p50, p95, p99 and the budget sit a few pixels apart; their labels must not meet."""
    panel.resize(600, 220)  # short histograms, as on a 720-line projector
    panel.set_budget(1.0, 0.021)
    for i in range(60):
        panel.add_finished(timeline(i, arrival=float(i) * 0.1, ttft=0.2, tpot=0.02 + 0.0001 * (i % 3)))
    panel.flush()
    qtbot.wait(50)  # labels take their place on screen when painted
    plot = panel._plots["tpot"]
    box = plot.getPlotItem().vb.sceneBoundingRect()
    labels = [line.label for line in panel._lines["tpot"].values() if line.isVisible() and line.label.isVisible()]
    assert len(labels) >= 2
    rects = [label.mapRectToScene(label.boundingRect()) for label in labels]
    for i, rect in enumerate(rects):
        assert box.adjusted(-1, -1, 1, 1).contains(rect)
        for other in rects[i + 1:]:
            assert not rect.intersects(other), (labels[i].toPlainText(), rect, other)


def test_attached_servers_tokens_per_s_is_the_servers(panel):
    """Issue 27: attached, the tokens/s shown is the server's /metrics counter rate, not this client's
    count of the chunks it received (which read 3,488 tok/s while the server said 8.7)."""
    for i in range(50):  # chunks arriving at one instant, as a client sees a burst of streams
        panel.add_tokens(10.0, 10.0 + 0.001 * i, 70)
    panel.flush()
    assert panel.snapshot_data()["tokens_per_s_from"] == "client"
    panel.set_server_tokens_per_s(8.7, "inferlab")
    panel.flush()
    data = panel.snapshot_data()
    assert data["total_tokens_per_s"] == pytest.approx(8.7) and data["tokens_per_s_from"] == "server"
    assert "8.7" in data["summary"] and "inferlab's /metrics" in data["summary"]
    panel.reset()
    assert panel.snapshot_data()["tokens_per_s_from"] == "client"
