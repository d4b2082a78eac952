"""TradeoffPanel: cost math, measured filled vs predicted hollow, frontier, labels that never overlap,
hover text, click applies, price edits, the sweep button."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton
from widget_fakes import tradeoff_points

from engine.events import TradeoffPoint
from widgets.tradeoff import PREDICTED, TradeoffPanel, cost_per_million_tokens


@pytest.fixture
def panel(show):
    return show(TradeoffPanel(), 700, 500)


def _sweep() -> dict:
    pts = []
    for fmt, bits, agree in (("bf16", 16, 1.0), ("int8", 8, 0.97), ("int4", 4, 0.85)):
        for batch in (1, 8, 32):
            for draft in (0, 4):
                pts.append({"max_num_seqs": batch, "quant_format": fmt, "num_speculative_tokens": draft,
                            "predicted": False,
                            "tokens_per_s_user": 40.0 / batch ** 0.3 * (1 + 0.1 * (16 - bits) / 4) * (1 + 0.05 * draft),
                            "tokens_per_s_total": 40.0 * batch ** 0.7, "ppl_delta_pct": (1 - agree) * 30,
                            "kl": (1 - agree) / 2, "agreement": agree, "p50_tpot_ms": 30.0, "p99_tpot_ms": 50.0,
                            "p50_ttft_ms": 80.0, "p99_ttft_ms": 120.0, "weights_bytes": 1, "kv_blocks": 1})
    predicted = [{"model": m, "device": d, "quant_format": "int4", "max_num_seqs": 1, "num_speculative_tokens": 0,
                  "predicted": True,
                  "tokens_per_s_user": 100.0 * i, "tokens_per_s_total": 100.0 * i, "weights_bytes": 4e9,
                  "kv_capacity_tokens": 10_000, "agreement": None}
                 for i, (m, d) in enumerate((("7B", "A100"), ("7B", "H100"), ("70B", "H200")), start=1)]
    frontier = [{"max_num_seqs": b, "quant_format": "int4", "num_speculative_tokens": 4} for b in (1, 32, 8)]
    return {"points": pts, "frontier": frontier, "predicted": predicted}


def test_cost_math():
    assert cost_per_million_tokens(3.60, 1000.0) == pytest.approx(1.0)
    assert cost_per_million_tokens(2.50, 0.0) is None


def test_measured_filled_predicted_hollow_and_apart(panel):
    panel.set_sweep(_sweep())
    panel.flush()
    data = panel.snapshot_data()
    assert data["num_points"] == 18 and len(data["predicted"]) == 3
    assert not any(p["predicted"] for p in data["points"]) and all(p["predicted"] for p in data["predicted"])
    spots = {s.data(): s for s in panel._scatter.points()}
    hollow = [k for k, s in spots.items() if s.brush().style() == Qt.BrushStyle.NoBrush]
    assert sorted(hollow) == sorted(p["label"] for p in data["predicted"])
    assert all(PREDICTED in k for k in hollow)
    assert any(PREDICTED in t for t in data["labels"] or []) or any(
        PREDICTED in panel._labels[k].textItem.toPlainText() for k in panel._labels)
    fx, _ = panel._frontier_curve.getData()
    assert len(fx) == 3 and list(fx) == sorted(fx)


def test_labels_never_overlap(panel):
    panel.set_sweep(_sweep())
    panel.flush()
    rects = [item.mapRectToScene(item.boundingRect()) for item in panel._labels.values() if item.isVisible()]
    assert rects
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            assert not a.intersects(b)


def test_hover_and_click_apply(panel, qtbot):
    panel.set_sweep(_sweep())
    panel.flush()
    tip = panel._tip(x=0, y=0, data="batch 8 · int8 · k=4")  # as pyqtgraph 0.14 calls it: by keyword
    assert "top-1 agreement 97.0 %" in tip and "TPOT p50 30 ms" in tip
    assert "not measured" in panel._tip(x=0, y=0, data=panel.snapshot_data()["predicted"][0]["label"])
    spot = next(s for s in panel._scatter.points() if s.data() == "batch 8 · int8 · k=4")
    with qtbot.waitSignal(panel.sigApply, timeout=1000) as blocker:
        panel._on_clicked(panel._scatter, [spot])
    assert blocker.args == [{"max_num_seqs": 8, "quant_format": "int8", "num_speculative_tokens": 4}]


def test_hovering_a_point_shows_its_tooltip(panel, qtbot):
    """A real mouse move over a point: pyqtgraph's own hover path calls the tip (keyword arguments in
    0.14) and sets the view's tooltip to the point's text."""
    from PySide6.QtCore import QEvent, QPointF
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    def move_to(local: QPointF) -> None:
        view = panel._plot.viewport()
        QApplication.sendEvent(view, QMouseEvent(QEvent.Type.MouseMove, local, view.mapToGlobal(local),
                                                 Qt.MouseButton.NoButton, Qt.MouseButton.NoButton,
                                                 Qt.KeyboardModifier.NoModifier))

    panel.set_sweep(_sweep())
    panel.flush()
    spot = next(s for s in panel._scatter.points() if s.data() == "batch 8 · int8 · k=4")
    vb = panel._plot.getPlotItem().vb
    at = QPointF(panel._plot.mapFromScene(vb.mapViewToScene(QPointF(spot.pos()))))

    def hovered() -> bool:  # pyqtgraph drops mouse moves closer together than its rate limit: move again
        move_to(at)
        return "batch 8 · int8 · k=4" in vb.toolTip()

    qtbot.waitUntil(hovered, timeout=5000)
    assert "top-1 agreement 97.0 %" in vb.toolTip() and "copy as an `inferlab serve` command" in vb.toolTip()


def test_right_click_copies_a_point_as_a_command(panel, qtbot):
    from PySide6.QtCore import Qt as QtNS

    class RightClick:
        def button(self):
            return QtNS.MouseButton.RightButton

    panel.set_sweep(_sweep())
    panel.flush()
    spot = next(s for s in panel._scatter.points() if s.data() == "batch 32 · int4 · k=0")
    applied = []
    panel.sigApply.connect(applied.append)
    with qtbot.waitSignal(panel.sigCopyCommand, timeout=1000) as blocker:
        panel._on_clicked(panel._scatter, [spot], RightClick())
    assert blocker.args == [{"max_num_seqs": 32, "quant_format": "int4", "num_speculative_tokens": 0}] and not applied


def test_live_points_price_and_current(panel, qtbot):
    for p in tradeoff_points():
        panel.add_point(p)
    panel.set_current("bits=8 batch=32")
    panel.flush()
    data = panel.snapshot_data()
    assert data["num_points"] == 5 and data["current"] == "bits=8 batch=32"
    by_label = {p["label"]: p for p in data["points"]}
    assert by_label["bits=16 batch=8"]["cost_per_million_tokens"] == pytest.approx(2.5 / (320 * 3600) * 1e6)
    with qtbot.waitSignal(panel.sigPriceChanged, timeout=1000):
        panel.set_price_per_hour(7.20)
    panel.add_point(TradeoffPoint("a", {}, 10.0, 1000.0, 0.0))
    panel.flush()
    assert {p["label"]: p for p in panel.snapshot_data()["points"]}["a"]["cost_per_million_tokens"] == \
        pytest.approx(2.0)


def test_clear_and_sweep_button(panel, qtbot):
    panel.set_sweep(_sweep())
    panel.clear()
    assert panel.snapshot_data()["num_points"] == 0 and "Run sweep" in panel.snapshot_data()["empty_text"]
    with qtbot.waitSignal(panel.sigSweep, timeout=1000):
        qtbot.mouseClick(panel._sweep, Qt.MouseButton.LeftButton)


def test_labels_never_overlap_when_points_crowd(panel):
    sweep = _sweep()
    for i, p in enumerate(sweep["predicted"]):  # predicted points right on top of the measured frontier
        p["tokens_per_s_user"] = p["tokens_per_s_total"] = 30.0 + 3 * i
    panel.set_sweep(sweep)
    panel.flush()
    rects = [item.mapRectToScene(item.boundingRect()) for item in panel._labels.values() if item.isVisible()]
    assert len(rects) >= 2
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            assert not a.intersects(b)


def test_labels_meet_no_marker_and_stay_inside(panel, qtbot):
    sweep = _sweep()
    for i, p in enumerate(sweep["predicted"]):  # crowd the plot: predicted points among the measured ones
        p["tokens_per_s_user"] = p["tokens_per_s_total"] = 30.0 + 3 * i
    panel.set_sweep(sweep)
    panel.set_current("batch 8 · bf16 · k=0")
    panel.flush()
    qtbot.wait(50)  # a text item takes its place on screen when it is painted
    view = panel._plot.getPlotItem().vb.sceneBoundingRect()
    half = panel._scatter.opts["size"] / 2
    markers = []
    for s in panel._scatter.points():
        c = panel._scatter.mapToScene(s.pos())
        markers.append((c.x() - half, c.y() - half, c.x() + half, c.y() + half))
    labels = [item.mapRectToScene(item.boundingRect()) for item in panel._labels.values() if item.isVisible()]
    assert len(labels) >= 3
    for rect in labels:
        assert view.contains(rect)
        for x0, y0, x1, y1 in markers:
            assert not (rect.left() < x1 and rect.right() > x0 and rect.top() < y1 and rect.bottom() > y0), \
                (rect, (x0, y0, x1, y1))


def test_managed_server_points_show_their_command_line_when_chosen(panel, qtbot):
    """Issue 29: a tuning sweep's points, labelled engine · model · point; choosing one shows its command
    line under the plot; Copy command hands that line to the app; the frontier is the sweep's."""
    cmd = "llama-server -m m-q8_0.gguf -np {} -c 4096 --port 8080"
    points = [{"engine": "llama-server", "model": "tiny", "label": f"batch {b}, Q8_0, no draft", "batch": b,
               "weight_format": "q8_0", "weight_label": "Q8_0", "draft": 0, "flags": cmd.format(b)[13:],
               "command": cmd.format(b),
               "tokens_per_s_user": 50.0 / b, "tokens_per_s_total": 50.0 * b ** 0.5, "agreement": 0.9}
              for b in (1, 4)]
    panel.set_server_sweep("llama-server", "tiny", points, ["batch 1, Q8_0, no draft"])
    panel.flush()
    snap = panel.snapshot_data()
    assert {p["label"] for p in snap["points"]} == {"llama-server · tiny · batch 1, Q8_0, no draft",
                                                     "llama-server · tiny · batch 4, Q8_0, no draft"}
    assert snap["frontier"] == ["llama-server · tiny · batch 1, Q8_0, no draft"]
    assert not snap["command"]["shown"]
    label = "llama-server · tiny · batch 4, Q8_0, no draft"
    assert "flags: -m m-q8_0.gguf -np 4" in panel._tip(data=label)
    # a server's quality is its own greedy tokens against the bf16 point's, not teacher-forced top-1
    assert "greedy agreement 90.0 %" in panel._tip(data=label)
    assert "greedy agreement with the bf16 point" in panel._legend.text()
    spot = next(s for s in panel._scatter.points() if s.data() == label)
    panel._on_clicked(panel._scatter, [spot])  # a click chooses it (it does not apply it to the live engine)
    snap = panel.snapshot_data()
    assert snap["current"] == label and snap["command"]["shown"]
    assert snap["command"]["line"] == cmd.format(4) and snap["command"]["title"].startswith(label)
    with qtbot.waitSignal(panel.sigCopyText) as copied, qtbot.assertNotEmitted(panel.sigApply):
        panel._command.findChild(QPushButton, "copy-command").click()
    assert copied.args == [cmd.format(4)]
    with qtbot.waitSignal(panel.sigRunPoint) as run:
        panel._command.findChild(QPushButton, "run-point").click()
    assert run.args == [label]
    panel.set_server_sweep("llama-server", "tiny", points[:1], [])  # a new sweep of the same engine and model
    assert [p["label"] for p in panel.snapshot_data()["points"]] == ["llama-server · tiny · batch 1, Q8_0, no draft"]
