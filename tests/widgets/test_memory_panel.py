"""MemoryPanel: breakdown bar and legend, and the block map's cells, markers and tooltips."""
from __future__ import annotations

import time

import pytest
from PySide6.QtGui import QColor, QPalette
from widget_fakes import MiB, block_map, memory_snapshot

from engine.events import BlockInfo, BlockMapSnapshot
from widgets.block_map import BlockMapView, grid_layout
from widgets.memory_panel import MemoryPanel
from widgets.theme import free_block_color, memory_color, request_color


@pytest.fixture
def panel(show):
    return show(MemoryPanel(), 700, 600)


def _close(a: QColor, b: QColor, tol: int = 6) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a.getRgb()[:3], b.getRgb()[:3]))


def test_breakdown_and_legend(panel):
    panel.set_memory(memory_snapshot(used=300, cached=100, total=2000))
    panel.flush()
    data = panel.snapshot_data()
    block = 36 * 1024 * 16
    assert data["source"] == "NVML" and data["device"] == "cuda:0"
    assert data["bytes"]["weights"] == 270 * MiB
    assert data["bytes"]["kv_used"] == 300 * block
    assert data["bytes"]["kv_cached"] == 100 * block
    assert data["bytes"]["kv_free"] == 1600 * block
    assert "source: <b>NVML</b>" in data["header"]
    assert "Weights: <b>270.0 MiB</b>" in panel._legend_labels["weights"].text()
    # the bar is drawn in category order, widths proportional to bytes
    rects = panel.bar.segment_rects()
    assert list(rects) == ["weights", "kv_used", "kv_cached", "kv_free", "activations", "other", "free"]
    assert rects["kv_free"].width() > rects["kv_used"].width() > rects["kv_cached"].width()
    img = panel.bar.grab().toImage()
    assert _close(img.pixelColor(rects["weights"].center()), memory_color("weights", panel.palette()))


def test_legend_says_how_much_of_the_weights_is_a_packed_copy(panel):
    import dataclasses

    snap = dataclasses.replace(memory_snapshot(source="budget", device="cpu"), packed_weights_bytes=100 * MiB)
    panel.set_memory(snap)
    panel.flush()
    text = panel._legend_labels["weights"].text()
    assert "Weights: <b>270.0 MiB</b>" in text and "of which 100.0 MiB a oneDNN-packed copy" in text
    panel.set_memory(memory_snapshot(source="budget", device="cpu"))
    panel.flush()
    assert "packed" not in panel._legend_labels["weights"].text()


def test_captured_graphs_get_a_share_only_where_they_hold_memory(panel):
    import dataclasses

    snap = dataclasses.replace(memory_snapshot(), graphs_bytes=50 * MiB, other_bytes=850 * MiB)
    panel.set_memory(snap)
    panel.flush()
    assert panel.snapshot_data()["bytes"]["graphs"] == 50 * MiB
    assert list(panel.bar.segment_rects())[4:6] == ["activations", "graphs"]
    assert "CUDA graphs (measured): <b>50.0 MiB</b>" in panel._legend_labels["graphs"].text()
    for graphs in (0, None):  # the CPU (nothing captured) and graphs off: no share
        panel.set_memory(dataclasses.replace(snap, graphs_bytes=graphs))
        panel.flush()
        assert "graphs" not in panel.snapshot_data()["bytes"] and "graphs" not in panel.bar.segment_rects()


def test_cpu_budget_source_named(panel):
    panel.set_memory(memory_snapshot(source="budget", device="cpu"))
    panel.flush()
    assert panel.snapshot_data()["source"] == "CPU budget"


def test_block_map_marks_owner_shared_cached_and_free(panel):
    # block 0: shared by two requests; 1: owned by req-a; 2: cached and free (reusable); 3: free
    snap = BlockMapSnapshot(block_size=16, num_blocks=64,
                            block_tables={"req-a": (0, 1), "req-b": (0,)},
                            blocks=(BlockInfo(0, 2, True, ("req-a", "req-b")), BlockInfo(1, 1, False, ("req-a",)),
                                    BlockInfo(2, 0, True)))
    panel.set_block_map(snap)
    panel.flush()
    view = panel.block_map
    img = view.grab().toImage()
    base = view.palette().color(QPalette.ColorRole.Base)

    def centre(b):
        return img.pixelColor(view.block_rect(b).center())

    def edge(b):
        r = view.block_rect(b)
        return img.pixelColor(r.left() + 1, r.top() + 1)

    assert _close(centre(1), request_color("req-a"))
    assert _close(centre(0), QColor("white"), 30)  # shared: white dot in the middle
    assert _close(edge(0), request_color("req-a"))  # ... on the owner's colour
    cached_full = memory_color("kv_cached", view.palette())
    cached = centre(2)
    assert not _close(cached, cached_full, 20)  # dimmed, towards the background
    assert abs(cached.lightness() - base.lightness()) < abs(cached_full.lightness() - base.lightness())
    assert _close(centre(3), free_block_color(view.palette()))
    assert not _close(centre(3), cached, 10)
    counts = panel.snapshot_data()["blocks"]
    assert counts == {"total": 64, "used": 2, "cached": 1, "free": 61, "shared": 1, "requests": 2,
                      "block_size": 16}


def test_block_tooltip(panel):
    panel.set_block_map(block_map(num_blocks=500, num_requests=3, shared_prefix=2))
    panel.flush()
    view = panel.block_map
    tip = view.tooltip_at(view.block_rect(1).center())
    assert tip.splitlines() == ["block 1", "owners: req-0, req-1, req-2", "ref count 3 · shared",
                                "cached: yes (reusable prefix)"]
    assert view.tooltip_at(view.block_rect(400).center()) == "block 400\nfree"


def test_grid_layout_fits_everything():
    for n, w, h in ((1, 100, 100), (4096, 800, 300), (50_000, 640, 240), (7, 3, 500)):
        cell, cols = grid_layout(n, w, h)
        rows = -(-n // cols)
        assert cols * cell <= max(w, cols) and (rows * cell <= h or cell == 1)


def test_many_blocks_paint_fast(qtbot):
    view = BlockMapView()
    qtbot.addWidget(view)
    view.resize(900, 400)
    view.show()
    snap = block_map(num_blocks=20_000, num_requests=200, blocks_per_request=60, num_cached=2000)
    t0 = time.perf_counter()
    for _ in range(5):
        view.set_snapshot(snap)
        view.grab()
    assert (time.perf_counter() - t0) / 5 < 0.5  # ~0.05 s on a quiet machine: a margin for a loaded one
    assert view.counts()["used"] == 200 * 60 + 4


def test_real_mouse_events_outline_the_owner_and_show_the_tip(panel, qtbot):
    from PySide6.QtCore import QEvent, QPointF, Qt
    from PySide6.QtGui import QHelpEvent, QMouseEvent
    from PySide6.QtWidgets import QApplication, QToolTip

    panel.set_block_map(block_map(num_blocks=500, num_requests=3, shared_prefix=2))
    panel.flush()
    view = panel.block_map
    pos = view.block_rect(1).center()
    # the move event straight to the view: the platform cursor (qtbot.mouseMove) goes to whatever window an
    # earlier test left on top at that spot, so in a full run the view may never see it
    move = QMouseEvent(QEvent.Type.MouseMove, QPointF(pos), QPointF(view.mapToGlobal(pos)),
                       Qt.MouseButton.NoButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(view, move)
    assert view._hover == "req-0"  # the owner whose blocks get outlined
    QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, pos, view.mapToGlobal(pos)))
    assert QToolTip.text().startswith("block 1")
    QApplication.sendEvent(view, QEvent(QEvent.Type.Leave))
    assert view._hover is None


def test_cpu_bar_spans_the_engine_budget_not_the_host(panel):
    snap = memory_snapshot(source="budget", device="cpu")
    panel.set_memory(snap)
    panel.flush()
    data = panel.snapshot_data()
    budget = snap.weights_bytes + snap.kv_bytes_total + snap.activation_bytes
    assert data["total_bytes"] == budget < snap.device_total_bytes
    assert set(data["bytes"]) == {"weights", "kv_used", "kv_cached", "kv_free", "activations"}
    assert "the bar is the engine's budget" in data["header"]
    assert panel._legend_labels["free"].isHidden() and panel._legend_labels["other"].isHidden()
    gpu = memory_snapshot(source="nvml", device="cuda:0")
    panel.set_memory(gpu)
    panel.flush()
    assert panel.snapshot_data()["total_bytes"] == gpu.device_total_bytes
    assert not panel._legend_labels["free"].isHidden()


def test_before_the_first_snapshot_the_legend_names_no_cuda_graphs(panel):
    # the device is unknown until the first snapshot: a CPU engine must not see "CUDA graphs" listed
    labels = panel._legend_labels
    assert labels["weights"].isVisibleTo(panel) and not labels["graphs"].isVisibleTo(panel)
