"""Issue 27, point 2: at 1280x720 in presenter mode every chapter shows what its caption promises. Each
preset's comparison, filled with figures as wide as real ones get (long labels, ratios, GiB), fits its
table's columns in the panel's width (no cut column, no horizontal scroll bar), and each panel the
caption names (timeline, block map, heatmap, token stream, ...) is on screen."""
from __future__ import annotations

import pytest
from app_helpers import close_window, open_window, run_for, wait_until

from app.talk import presets

SIZE = (1280, 720)
# words of a caption -> the panel that shows them
PROMISED = {"timeline": "timeline", "gantt": "timeline", "block map": "memory", "heatmap": "quant",
            "token stream": "tokens", "tradeoff": "tradeoff", "acceptance": "spec", "comparison": "comparison",
            "memory bar": "memory"}
MIN_PANEL_PX = 120  # a panel squeezed below this shows the room nothing


def wide_value(metric: str, i: int) -> float:
    """A figure as wide as a real one gets, and ten times the first configuration's (a wide ratio)."""
    base = 1.2e9 if "bytes" in metric else 99.9 if metric.endswith("_pct") else 12_345.6
    return base if i == 0 or metric.endswith("_pct") else base * 10.3


def synthetic_result(spec) -> dict:
    rows = []
    for i, c in enumerate(spec.configs):
        row = {"label": c.label, "config": {"mode": c.mode, **c.knobs},
               "metrics": {m: wide_value(m, i) for m in spec.metrics}}
        if c.mode == "contiguous":
            row["computed"] = True
        rows.append(row)
    return {"title": spec.title, "knob": spec.knob, "metrics": list(spec.metrics), "chart": list(spec.chart),
            "comparison": rows, "measured_at": "2026-12-01T23:59:00+00:00",
            "machine": {"cpu": "AMD EPYC 9B14 96-Core Processor", "threads": 1, "torch": "2.13.0"}}


@pytest.fixture(scope="module")
def window(qapp, tiny_llama):
    w = open_window(tiny_llama, preset="continuous-batching")
    w.resize(*SIZE)
    w.set_presenter(True, full_screen=False, screen_height=SIZE[1])
    yield w
    close_window(w)


@pytest.mark.parametrize("name", [n for n in presets.available() if presets.load_preset(n).compare is not None])
def test_every_table_fits_and_the_promised_panels_show(qapp, window, name):
    preset = presets.load_preset(name)
    assert window.controller.apply_preset(name), window.controller.last_error
    wait_until(qapp, lambda: window.controller.engine_ready, timeout_s=60)
    comparison = window.panels.comparison
    if not preset.compare.not_built:
        comparison.set_result(synthetic_result(preset.compare))
    for _ in range(6):  # the layout settles (the comparison's dock is re-balanced on a timer)
        run_for(qapp, 0.25)
        window.flush_panels()
    need = window.minimumSizeHint()
    assert need.height() <= SIZE[1] and window.height() <= SIZE[1], \
        f"{name}: the window needs {need.height()} lines and has {window.height()}: the room would scroll"
    table = comparison.table
    if table.isVisible():
        columns = table.horizontalHeader().length() + table.verticalHeader().width() + 2 * table.frameWidth()
        assert columns <= table.width(), f"{name}: the table needs {columns} px, it has {table.width()}"
        assert not table.horizontalScrollBar().isVisible(), f"{name}: a column is cut"
        assert comparison.width() <= SIZE[0]
    caption = preset.caption.lower()
    for word, panel in PROMISED.items():
        if word in caption:
            dock = window.docks[panel]
            assert dock.isVisible(), f"{name}: the caption names the {word}, the {panel} panel is not shown"
            assert dock.height() >= MIN_PANEL_PX and dock.width() >= MIN_PANEL_PX, \
                f"{name}: the {panel} panel is {dock.width()}x{dock.height()}"
