"""ControlsPanel: drawn from the knob table, debounced config signals, silent presets, load/burst/reset, busy and
unavailable states."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine.knobs import KNOB, KNOBS
from widgets.controls import CONFIG_KEYS, DEBOUNCE_MS, ControlsPanel

# what the app hands the panel (app/talk/knob_defaults.py: EngineConfig's defaults and the like)
DEFAULTS = {"max_num_seqs": 64, "quant_format": "bf16", "kv_cache_dtype": "auto", "num_speculative_tokens": 0,
            "max_num_batched_tokens": 512,
            "arrival_rate": 2.0, "burst_size": 16, "ttft_budget_ms": 1000.0, "tpot_budget_ms": 100.0}


@pytest.fixture
def panel(show):
    return show(ControlsPanel(defaults=DEFAULTS), 500, 500)


def test_slider_drag_is_debounced_into_one_signal(panel, qtbot):
    emitted = []
    panel.sigConfigChanged.connect(emitted.append)
    slider = panel.row("max_num_seqs").slider
    with qtbot.waitSignal(panel.sigConfigChanged, timeout=2000) as blocker:
        for v in range(10, 40):  # a drag: 30 moves
            slider.setValue(v)
    assert len(emitted) == 1
    assert blocker.args[0] == {"max_num_seqs": 40, "quant_format": "bf16", "kv_cache_dtype": "auto",
                               "num_speculative_tokens": 0, "max_num_batched_tokens": 512}
    assert set(blocker.args[0]) == set(CONFIG_KEYS)
    qtbot.wait(DEBOUNCE_MS + 100)
    assert len(emitted) == 1
    assert panel.row("max_num_seqs").value_text() == "40"


def test_format_and_budget_sliders(panel, qtbot):
    row = panel.row("quant_format")
    assert row.values() == ("bf16", "int8", "fp8-e4m3", "int4")  # a format slider: two of them are 8 bits
    with qtbot.waitSignal(panel.sigConfigChanged, timeout=2000) as blocker:
        row.slider.setValue(2)
    assert blocker.args[0]["quant_format"] == "fp8-e4m3" and row.value_text() == "fp8 e4m3"
    with qtbot.waitSignal(panel.sigBudgetChanged, timeout=2000) as blocker:
        panel.row("ttft_budget_ms").set_value(250)  # silent
        panel.row("tpot_budget_ms").slider.setValue(panel.row("tpot_budget_ms").slider.value() + 1)
    assert blocker.args == [pytest.approx(250), pytest.approx(105)]  # ms, as the knobs
    with qtbot.waitSignal(panel.sigLoadChanged, timeout=2000) as blocker:
        panel.row("arrival_rate").slider.setValue(55)
    assert blocker.args[0] == {"arrival_rate": pytest.approx(5.5)}


def test_set_values_is_silent(panel, qtbot):
    with qtbot.assertNotEmitted(panel.sigConfigChanged, wait=DEBOUNCE_MS + 100):
        panel.set_values({"max_num_seqs": 8, "quant_format": "int8", "num_speculative_tokens": 4,
                          "max_num_batched_tokens": 1000, "arrival_rate": 1.5, "burst_size": 32,
                          "model": "ignored"})
    v = panel.snapshot_data()["values"]
    assert v["max_num_seqs"] == 8 and v["quant_format"] == "int8" and v["num_speculative_tokens"] == 4
    assert v["max_num_batched_tokens"] == 1024  # nearest slider stop
    assert v["arrival_rate"] == pytest.approx(1.5) and v["burst_size"] == 32


def test_preset_cancels_a_pending_drag(panel, qtbot):
    panel.row("max_num_seqs").slider.setValue(3)
    with qtbot.assertNotEmitted(panel.sigConfigChanged, wait=DEBOUNCE_MS + 100):
        panel.set_values({"max_num_seqs": 16})


def test_load_burst_reset_buttons(panel, qtbot):
    with qtbot.waitSignal(panel.sigStartLoad, timeout=1000):
        qtbot.mouseClick(panel._load_button, Qt.MouseButton.LeftButton)
    assert panel._load_button.text() == "Stop load" and panel.snapshot_data()["load_running"]
    with qtbot.waitSignal(panel.sigStopLoad, timeout=1000):
        qtbot.mouseClick(panel._load_button, Qt.MouseButton.LeftButton)
    panel._burst_size.setValue(12)
    with qtbot.waitSignal(panel.sigBurst, timeout=1000) as blocker:
        qtbot.mouseClick(panel._burst_button, Qt.MouseButton.LeftButton)
    assert blocker.args == [12]
    with qtbot.waitSignal(panel.sigReset, timeout=1000):
        qtbot.mouseClick(panel._reset_button, Qt.MouseButton.LeftButton)


def test_busy_and_unavailable(panel):
    panel.set_busy("requantizing to 4-bit…", 0.25)
    data = panel.snapshot_data()
    assert data["busy"] == "requantizing to 4-bit…" and data["busy_fraction"] == pytest.approx(0.25)
    panel.set_busy("loading…")  # indeterminate
    assert panel.snapshot_data()["busy_fraction"] is None
    panel.set_busy(None)
    assert panel.snapshot_data()["busy"] is None
    panel.set_feature_available("quant_format", False, "quantization is not implemented yet")
    row = panel.row("quant_format")
    assert not row.isEnabled() and row.toolTip() == "quantization is not implemented yet"
    assert row.value_text() == "n/a"
    assert panel.snapshot_data()["unavailable"] == {"quant_format": "quantization is not implemented yet"}
    panel.set_feature_available("burst", False, "no load generator")
    assert not panel._burst_button.isEnabled()
    panel.set_feature_available("quant_format", True)
    assert row.isEnabled() and row.value_text() == "bf16" and row.toolTip() == KNOB["quant_format"].help
    with pytest.raises(KeyError):
        panel.set_feature_available("warp_drive", False)


def test_reset_goes_back_to_the_defaults_it_was_given(show):
    panel = show(ControlsPanel(defaults={**DEFAULTS, "max_num_seqs": 32, "burst_size": 4}), 500, 500)
    panel.set_values({"max_num_seqs": 8, "burst_size": 20})
    panel.reset()
    values = panel.snapshot_data()["values"]
    assert values["max_num_seqs"] == 32 and values["burst_size"] == 4 and values["max_num_batched_tokens"] == 512


def test_every_slider_is_a_row_of_the_knob_table(show):
    """The panel draws the table: each row with a `slider` is a slider with the row's label, stops, help and
    words for its value, and there is no slider the table does not have."""
    panel = show(ControlsPanel(), 500, 500)
    drawn = {row.name for row in KNOBS if row.slider is not None}
    assert set(panel.snapshot_data()["values"]) - {"burst_size"} == drawn
    for name in drawn:
        row, slider = KNOB[name], panel.row(name)
        assert slider.values() == row.stops and slider.toolTip() == row.help
        assert slider.value_text() == row.text(slider.value())


def test_a_long_busy_text_wraps_instead_of_widening_the_panel(panel, qtbot):
    """The busy text ("measuring perplexity of fp8-e4m3 weights on the held-out text…") wraps under the reset
    button: on one line beside it, it widened the panel past a 1280x720 window's dock and pushed every slider's
    value behind a horizontal scroll bar."""
    idle = panel.minimumSizeHint().width()
    panel.set_busy("measuring perplexity of fp8-e4m3 weights on the held-out text (about a minute on a CPU)…", 0.5)
    qtbot.wait(50)  # the layout takes the label's new size on its next pass
    assert panel.minimumSizeHint().width() <= idle
    assert panel.snapshot_data()["busy"].startswith("measuring perplexity")
