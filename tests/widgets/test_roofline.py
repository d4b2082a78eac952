"""RooflinePanel on synthetic data: roofs drawn from the measured numbers, dots per kind, verdicts."""
from __future__ import annotations

import math

import pytest

from widgets.roofline import RooflinePanel


@pytest.fixture
def panel(show):
    return show(RooflinePanel(), 700, 500)


def test_roofs_and_dots(panel):
    assert panel.snapshot_data()["empty_text"]  # no roofs yet: says it is measuring
    panel.set_roofs({"bfloat16": 2e12, "float32": 4e11}, 2.5e10, "GEMM 2048^3, median of 5", "test cpu")
    for i in range(5):
        panel.add_step("decode", 1.0 + i, 1e10)
    panel.add_step("prefill", 300.0, 5e11)
    panel.add_step("decode", 0.0, 1e9)  # nothing counted: not drawn
    panel.set_verdict("decode", "decode: memory-bound, 71 % of measured bandwidth")
    panel.flush()
    data = panel.snapshot_data()
    assert data["dots"] == {"prefill": 1, "decode": 5, "verify": 0} and data["empty_text"] == ""
    xs, ys = panel._roof.getOriginalDataset()
    # the roof: bandwidth x intensity up to the ridge (80 FLOPs/byte), then flat at the bf16 peak
    assert max(ys) == pytest.approx(2e12) and min(ys) == pytest.approx(0.1 * 2.5e10)
    sx, sy = panel._scatters["prefill"].getData()
    assert sx[0] == pytest.approx(math.log10(300.0)) and sy[0] == pytest.approx(math.log10(5e11))
    assert "71 % of measured bandwidth" in panel._verdict_label.text()
    assert "median of 5" in panel._how.text() and "(measured)" in panel._roof_labels[0].toPlainText()


def test_reset_keeps_roofs(panel):
    panel.set_roofs({"bfloat16": 1e12}, 1e10, "how", "cpu")
    panel.add_step("decode", 2.0, 1e9)
    panel.reset()
    assert panel.snapshot_data()["dots"]["decode"] == 0 and panel.snapshot_data()["roofs"] is not None


def test_a_long_verdict_wraps_instead_of_widening_the_dock(panel):
    """At 1280x720 the roofline shares a column with the memory and LoRA docks: a verdict on one line made the
    panel at least 448 px wide and pushed the multi-lora window past the screen (1,290-1,304 px)."""
    panel.set_verdict("decode", "decode: memory-bound, 71 % of measured bandwidth (read 262 MiB of weights a step)")
    panel.set_verdict("prefill", "prefill: compute-bound, 64 % of the measured bf16 peak at 300 FLOPs a byte")
    panel.flush()
    assert panel.minimumSizeHint().width() < 300
