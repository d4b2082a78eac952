"""QuantErrorPanel: a per-layer heatmap of the engine's relative weight error, an honest bf16 state."""
from __future__ import annotations

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from widgets.quant_error import OFF_TEXT, QuantErrorPanel
from widgets.quant_heatmap import grid_of, pct, text_color_on
from widgets.theme import THEMES, apply_theme

KINDS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


def report(num_layers: int = 30, embeddings: bool = True) -> dict[str, float]:
    """A synthetic 4-bit report: 2.0-2.9 %, layers.3.mlp.down_proj the worst at 4 %."""
    errors = {f"layers.{i}.{m}.{k}": 0.020 + 0.001 * ((i + j) % 10)
              for i in range(num_layers) for j, (m, k) in enumerate(KINDS)}
    errors["layers.3.mlp.down_proj"] = 0.04
    if embeddings:
        errors["embed_tokens"] = errors["lm_head"] = 0.004
    return errors


@pytest.fixture
def panel(show):
    return show(QuantErrorPanel(), 560, 490)


def test_off_until_a_report_arrives(panel):
    panel.flush()
    assert panel.overlay_text() == OFF_TEXT
    assert OFF_TEXT.startswith("bf16 weights: nothing is quantized.") and "'weights'" in OFF_TEXT
    data = panel.snapshot_data()
    assert data["off"] and data["quant_format"] is None and data["num_cells"] == 0 and data["worst"] is None
    assert data["mean_error"] is None and data["max_error"] is None


def test_snapshot_of_a_full_report(panel):
    errors = report()
    panel.set_report("int4", errors)
    panel.flush()
    assert panel.overlay_text() == "" and not panel._overlay.isVisible()
    data = panel.snapshot_data()
    assert data["quant_format"] == "int4" and not data["off"]
    assert data["num_cells"] == 30 * 4 + 2 and data["num_layers"] == 30
    assert data["columns"] == ["qkv", "o", "gate_up", "down"]
    assert data["extra_rows"] == ["embed_tokens", "lm_head"]
    assert data["worst"] == "layers.3.mlp.down_proj" and data["max_error"] == pytest.approx(0.04)
    assert data["mean_error"] == pytest.approx(sum(errors.values()) / len(errors))
    title = panel._title.text()
    assert "int4 weights" in title and "‖W−Ŵ‖/‖W‖" in title
    assert "layers.3.mlp.down_proj" in title and "4.0 %" in title and pct(data["mean_error"]) in title


def test_back_to_16_bits_is_off_again(panel):
    panel.set_report("int4", report())
    panel.flush()
    panel.set_report("bf16", {})
    panel.flush()
    assert panel.overlay_text() == OFF_TEXT
    assert panel.snapshot_data()["quant_format"] == "bf16" and panel.snapshot_data()["num_cells"] == 0
    panel.set_report("int8", report(2, embeddings=False))
    panel.reset()
    assert panel.snapshot_data()["quant_format"] is None and panel.overlay_text() == OFF_TEXT


def test_grid_layout_from_names():
    g = grid_of(["lm_head", "layers.1.mlp.down_proj", "layers.0.self_attn.o_proj", "embed_tokens",
                 "layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"])
    assert g.layers == [0, 1] and g.columns == ["o_proj", "down_proj"]  # the model's order, not the names'
    assert g.top == ["embed_tokens"] and g.bottom == ["lm_head"]
    assert g.cells[(1, "o_proj")] == "model.layers.1.self_attn.o_proj"


def test_cells_in_rows_and_columns_and_tooltips(panel):
    panel.set_report("int4", report())
    panel.flush()
    view = panel.view
    rects = view.cell_rects()
    assert len(rects) == 122
    first, below = rects["layers.0.self_attn.qkv_proj"], rects["layers.1.self_attn.qkv_proj"]
    right = rects["layers.0.self_attn.o_proj"]
    assert below.top() > first.top() and right.left() > first.left()  # layer 0 at the top, qkv first
    assert rects["embed_tokens"].bottom() < first.top() < rects["layers.29.mlp.down_proj"].top()
    assert rects["lm_head"].top() > rects["layers.29.mlp.down_proj"].bottom()
    assert rects["embed_tokens"].width() > 3 * first.width()  # a full-width row
    for name, r in rects.items():
        assert view.rect().contains(r.toRect()), name
        assert view.cell_at(r.center()) == name
    worst = rects["layers.3.mlp.down_proj"].center()
    tip = view.tooltip_at(worst)
    assert "layers.3.mlp.down_proj" in tip and "4.0 %" in tip
    assert "embed_tokens" in view.tooltip_at(rects["embed_tokens"].center()) and "0.40 %" in view.tooltip_at(
        rects["embed_tokens"].center())
    assert view.cell_at(QPointF(1, 1)) is None and view.tooltip_at(QPointF(1, 1)) == ""


def test_colour_scale_runs_from_zero_to_the_worst(panel):
    panel.set_report("int4", report())
    panel.flush()
    view = panel.view
    assert view.color_of(0.04) == view.color_of(1.0)  # the worst is the top of the scale
    assert view.color_of(0.0).lightness() < view.color_of(0.04).lightness()  # viridis: dark -> bright
    assert text_color_on(QColor("#fde725")) == QColor("#000000")
    assert text_color_on(QColor("#440154")) == QColor("#ffffff")


@pytest.mark.parametrize("theme", THEMES)
def test_renders_in_both_themes(qapp, show, theme):
    palette, options = qapp.palette(), {k: pg.getConfigOption(k) for k in ("background", "foreground")}
    apply_theme(qapp, theme)
    try:
        for errors in (report(), report(2, embeddings=False), {}):
            panel = show(QuantErrorPanel(), 560, 490)
            panel.set_report("int4" if errors else "bf16", errors)
            panel.flush()
            img = panel.grab().toImage()
            assert not img.isNull() and img.width() == 560
            small = show(QuantErrorPanel(), 240, 170)  # tiny dock: no numbers in cells, still paints
            small.set_report("int4", errors)
            small.flush()
            assert not small.grab().toImage().isNull()
    finally:  # leave the application as it was for the next test
        qapp.setPalette(palette)
        pg.setConfigOptions(**options)


def test_percent_format():
    assert pct(0.0042) == "0.42 %" and pct(0.021) == "2.1 %" and pct(0.0) == "0 %"
