"""TimelinePanel: stacked tokens per step, queue lines, markers, config changes, and the Gantt rows."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint
from widget_fakes import TrafficSim

from engine.events import StepStats
from widgets.timeline import TimelinePanel


def step(i: int, t: float, scheduled=(), prefill=0, decode=0, verify=0, preempted=0, rejected=0,
         running=1, waiting=0, wall=0.02) -> StepStats:
    return StepStats(step=i, t_start=t, wall_time_s=wall, num_prefill_tokens=prefill, num_decode_tokens=decode,
                     num_running=running, num_waiting=waiting, num_preempted=preempted, kv_blocks_used=0,
                     kv_blocks_total=100, num_verify_tokens=verify, num_rejected=rejected,
                     scheduled=tuple(scheduled))


@pytest.fixture
def panel(show):
    return show(TimelinePanel(max_steps=50), 700, 700)


def test_steps_markers_and_ring_buffer(panel):
    for i in range(80):
        panel.add_step(step(i, 10 + 0.03 * i, prefill=100 if i % 4 == 0 else 0, decode=8, verify=3 * (i % 2),
                            preempted=int(i == 70), rejected=int(i in (60, 75)), running=8, waiting=i % 5))
    panel.flush()
    data = panel.snapshot_data()
    assert data["num_steps"] == 50 and data["first_step"] == 30 and data["last_step"] == 79
    assert data["last"] == {"prefill": 0, "decode": 8, "verify": 3, "running": 8, "waiting": 4}
    assert data["num_preemption_markers"] == 1 and data["num_rejection_markers"] == 2
    # the stacked curves: prefill, then decode on top, then verify on top of both
    y_prefill = panel._fills["prefill"].getData()[1]
    y_verify = panel._fills["verify"].getData()[1]
    assert y_prefill[-4] == 100 and y_verify[-4] == 100 + 8 + 3 * (76 % 2)
    assert len(panel._preempt.getData()[0]) == 1 and len(panel._reject.getData()[0]) == 2


def test_step_time_plot_and_median(panel):
    walls = [0.040] * 30 + [12.0] + [0.010] * 19  # eager steps, one compiling step, compiled steps
    for i, wall in enumerate(walls):
        panel.add_step(step(i, float(i), decode=4, wall=wall))
    panel.flush()
    x, ms = panel._step_ms.getData()
    # the compile stall does not set the scale: it is drawn at the top, marked, and named in the title
    assert list(x) == list(range(50)) and ms[30] == pytest.approx(120) and ms[-1] == pytest.approx(10)
    assert list(panel._stalls.getData()[0]) == [30]
    assert panel._time_plot.getPlotItem().viewRange()[1][1] == pytest.approx(144)
    assert panel.snapshot_data()["step_ms"] == pytest.approx(10)
    title = panel._time_plot.getPlotItem().titleLabel.text
    assert "last 10 ms" in title and "median 40 ms (50 steps)" in title
    assert "1 off the scale ↑ (longest 12.0 s)" in title
    stall, rejected = panel._stalls.opts, panel._reject.opts  # never read as a rejection: another mark
    assert stall["symbol"] != rejected["symbol"] and stall["brush"].color() != rejected["brush"].color()


def test_config_change_lines_scroll_out(panel):
    panel.add_step(step(0, 1.0))
    panel.mark_config_change("max_num_seqs 8 → 32")
    panel.flush()
    assert panel.snapshot_data()["config_changes"] == ["max_num_seqs 8 → 32"]
    lines = panel._marks[0][2]
    assert lines[0].label.toPlainText() == "max_num_seqs 8 → 32" and len(lines) == 3  # one per plot
    panel.mark_config_change("chunked prefill on")  # a second mark close by: its label at another height
    assert panel._marks[1][2][0].label.orthoPos != lines[0].label.orthoPos
    for i in range(1, 60):
        panel.add_step(step(i, 1.0 + i * 0.03))
    panel.flush()
    assert panel.snapshot_data()["config_changes"] == []  # their step left the ring buffer


def test_cue_labels_inside_the_plot_and_apart(panel, qtbot):
    """Long cue labels, close together and near the right edge: each stays inside the plot (on the left
    of its line, or wrapped) and no two meet; a label with no free height is hidden, not printed over."""
    texts = ["cue: two long prompts arrive, each prefilled in one long step: TTFT and TPOT spike at once",
             "chunked prefill off → on",
             "cue: chunked prefill lets decodes slip in between", "cue: the same burst again", "max_num_seqs 8 → 32"]
    for i in range(40):
        panel.add_step(step(i, 1.0 + 0.03 * i, decode=4))
        if i in (20, 30, 34, 37, 39):  # the first in the middle: too long for either side, it wraps
            panel.mark_config_change(texts[(20, 30, 34, 37, 39).index(i)])
    panel.flush()
    qtbot.wait(50)  # labels take their place on screen when painted
    box = panel._tokens_plot.getPlotItem().vb.sceneBoundingRect()
    shown = [lines[0].label for _x, _t, lines in panel._marks if lines[0].label.isVisible()]
    assert len(shown) >= 3
    rects = [label.mapRectToScene(label.boundingRect()) for label in shown]
    legend = panel._tokens_plot.getPlotItem().legend
    assert legend is None or not legend.isVisible()  # outside the data: chips under the title
    for i, rect in enumerate(rects):
        assert box.adjusted(-1, -1, 1, 1).contains(rect), (shown[i].toPlainText(), rect, box)
        for other in rects[i + 1:]:
            assert not rect.intersects(other)


def test_gantt_segments(panel):
    g = panel.gantt
    panel.request_arrived("a", 0.0)
    panel.request_arrived("b", 0.05)
    # a: two prefill chunks, then two decode steps (merged), b queued until its prefill at 0.3
    panel.add_step(step(0, 0.1, [("a", 256, "prefill")], prefill=256))
    panel.add_step(step(1, 0.13, [("a", 100, "prefill")], prefill=100))
    panel.add_step(step(2, 0.16, [("a", 1, "decode")], decode=1))
    panel.add_step(step(3, 0.19, [("a", 1, "decode")], decode=1))
    # a is preempted (recompute: back to prefill) while b runs
    panel.add_step(step(4, 0.30, [("b", 40, "prefill")], prefill=40))
    panel.add_step(step(5, 0.50, [("a", 358, "prefill"), ("b", 1, "decode")], prefill=358, decode=1))
    panel.request_finished("b", 0.6, "stop")
    panel.flush()
    data = g.snapshot_data()
    assert data["rows"] == ["a", "b"]
    kinds_a = [s[2] for s in data["segments"]["a"]]
    assert kinds_a == ["prefill", "prefill", "decode", "preempted", "prefill"]
    decode = data["segments"]["a"][2]
    assert decode[0] == pytest.approx(0.16) and decode[1] == pytest.approx(0.21)  # merged
    assert data["segments"]["b"][0][0] == pytest.approx(0.30)  # queued 0.05 → 0.30
    assert data["finished"] == {"b": "stop"}
    tip = g.tooltip_at(QPoint(g.width() - 5, 2))  # row 0, "now"
    assert tip.startswith("a\nwaiting (not scheduled) at -0.0")


def test_explicit_preemption_and_window(panel):
    g = panel.gantt
    g.set_window(5.0)
    panel.request_arrived("a", 0.0)
    panel.add_step(step(0, 0.0, [("a", 1, "decode")]))
    panel.request_preempted("a", 0.1)
    panel.add_step(step(1, 1.0, [("a", 1, "decode")]))
    assert [s[2] for s in g.snapshot_data()["segments"]["a"]] == ["decode", "preempted", "decode"]
    panel.request_finished("a", 1.1, "length")
    panel.request_arrived("z", 10.0)  # now = 10: a finished more than 5 s ago
    assert g.snapshot_data()["rows"] == ["z"]


def test_simulated_trace_and_reset(panel):
    sim = TrafficSim(seed=3)
    for _ in range(200):
        s = sim.next_step()
        for rid, t in sim.arrivals:
            panel.request_arrived(rid, t)
        sim.arrivals.clear()
        panel.add_step(s)
    panel.flush()
    panel.grab()
    assert panel.snapshot_data()["gantt"]["rows"]
    panel.reset()
    data = panel.snapshot_data()
    assert data["num_steps"] == 0 and data["gantt"]["rows"] == []
