"""ComparisonPanel on synthetic results: values with ratios, the measured line, computed columns,
bars vs a curve, the not-built case, and no label cut short."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication, QLabel

from widgets.comparison import EMPTY_TEXT, ComparisonPanel
from widgets.comparison_format import metric_label, ratio_text

MACHINE = {"cpu": "Test CPU 9000", "gpu": None, "threads": 2, "torch": "2.13.0"}


def _result(**over) -> dict:
    r = {"title": "static batches vs continuous batching, the same 8 requests", "knob": None,
         "metrics": ["tokens_per_s", "p99_e2e_ms", "kv_bytes_peak"], "chart": ["tokens_per_s"],
         "metric_info": {}, "machine": MACHINE, "measured_at": "2026-11-30T15:40:00+00:00",
         "comparison": [
             {"label": "static batches of 4", "config": {"mode": "static"},
              "metrics": {"tokens_per_s": 10.0, "p99_e2e_ms": 900.0, "kv_bytes_peak": 2 * 2**20}},
             {"label": "continuous, 4 at a time", "config": {"mode": "continuous"},
              "metrics": {"tokens_per_s": 31.0, "p99_e2e_ms": 450.0, "kv_bytes_peak": 2 * 2**20}},
             {"label": "contiguous max-length reservation", "config": {"mode": "contiguous"}, "computed": True,
              "note": "computed, not run: 4 requests x 8192 tokens", "metrics": {"kv_bytes_peak": 64 * 2**20}}]}
    r.update(over)
    return r


def test_values_ratios_and_provenance(show):
    panel = show(ComparisonPanel(), 1280, 720)
    panel.set_result(_result())
    t = panel.table
    assert t.columnCount() == 3 and t.rowCount() == 3
    assert t.verticalHeaderItem(0).text() == "tokens/s"
    assert t.item(0, 0).text() == "10" and t.item(0, 1).text() == "31  (3.10x)"
    assert t.item(1, 1).text().endswith("(0.50x)")
    assert "(computed, not run)" in t.horizontalHeaderItem(2).text()
    assert t.item(0, 2).text() == "n/a" and t.item(2, 2).text().endswith("(32.0x)")
    assert panel.provenance.text() == "measured 2026-11-30 15:40 UTC on Test CPU 9000, 2 threads, torch 2.13.0"
    assert "computed, not run" in panel.notes.text()
    assert panel.bars.isVisible() and not panel.curve.isVisible()
    panel.set_result(_result(rounds=3))  # the configurations ran in turn: the figures are medians
    assert panel.provenance.text().endswith("torch 2.13.0, medians of 3 rounds in turn")


def test_numeric_knob_with_more_than_two_values_is_a_curve(show):
    rows = [{"label": f"max_num_seqs={b}", "config": {"mode": "continuous", "max_num_seqs": b},
             "metrics": {"tokens_per_s": 10.0 * b, "per_user_tokens_per_s": 30.0 / b}} for b in (1, 2, 4, 8)]
    panel = show(ComparisonPanel(), 1280, 720)
    panel.set_result(_result(knob="max_num_seqs", metrics=["tokens_per_s", "per_user_tokens_per_s"],
                             chart=["tokens_per_s", "per_user_tokens_per_s"], comparison=rows))
    assert panel.curve.isVisible() and not panel.bars.isVisible()
    assert len(panel.curve.getPlotItem().listDataItems()) == 2
    assert "per user tokens/s" in panel.curve.getPlotItem().titleLabel.text


def test_not_built_and_empty(show):
    panel = show(ComparisonPanel())
    assert panel.provenance.text() == EMPTY_TEXT and not panel.table.isVisible()
    panel.set_result({"title": "multi-LoRA", "not_built": "multi-LoRA serving is not built yet: no numbers",
                      "comparison": []})
    assert "not built yet" in panel.provenance.text() and panel.table.rowCount() == 0
    assert not panel.bars.isVisible() and not panel.curve.isVisible()


def test_predicted_metrics_are_labelled(show):
    panel = show(ComparisonPanel(), 1280, 720)
    rows = [{"label": "batch 1", "config": {}, "metrics": {"decode_tokens_per_s": 20.0,
                                                          "predicted_decode_tokens_per_s": 40.0}}]
    panel.set_result(_result(metrics=["decode_tokens_per_s", "predicted_decode_tokens_per_s"], comparison=rows,
                             chart=["decode_tokens_per_s", "predicted_decode_tokens_per_s"]))
    assert panel.table.verticalHeaderItem(1).text().startswith("predicted")
    assert "predicted" in panel.notes.text()


def test_no_label_is_cut_short(show):
    panel = show(ComparisonPanel(), 1280, 720)
    panel.set_result(_result())
    for lab in panel.findChildren(QLabel):
        if lab.isVisible() and lab.text():
            assert lab.wordWrap()  # wraps instead of eliding
    t = panel.table
    fm = t.fontMetrics()
    for j in range(t.columnCount()):
        for line in t.horizontalHeaderItem(j).text().split("\n"):
            assert fm.horizontalAdvance(line) <= t.columnWidth(j)
    for i in range(t.rowCount()):
        for j in range(t.columnCount()):
            assert fm.horizontalAdvance(t.item(i, j).text()) <= t.columnWidth(j)


def test_bar_labels_wider_than_their_column_wrap_and_keep_their_row(show):
    from widgets.comparison_bars import BarChart

    chart = show(BarChart(point_size=12), 300, 200)
    long = "max_num_seqs_without_any_space_at_all=16"
    chart.set_data(["tokens/s"], [(long, [10.0], ["10"], False), ("b", [5.0], ["5"], False)])
    rows = chart._row_heights(chart.width())
    assert rows[0] > rows[1]  # the long label's row grew to hold it on several lines
    chart.grab()
    assert chart.height() >= sum(rows)


def test_format_helpers():
    assert metric_label("p99_ttft_ms") == "p99 TTFT (ms)"
    assert metric_label("max_itl_ms") == "max inter-token gap (ms)"
    assert metric_label("slo_attainment_pct") == "SLO attainment (%)"
    assert metric_label("tokens_per_s") == "tokens/s"
    assert ratio_text(31.0, 10.0) == "3.10x" and ratio_text(5.0, 0) == "" and ratio_text(None, 1.0) == ""


def test_request_split_shows_for_the_last_configuration_that_has_one(show):
    rows = [{"label": f"rate={r}", "config": {"rate": r}, "metrics": {"goodput_rps": r / 2},
             "requests": [{"id": f"c{i}-{j}", "queue_ms": 10.0 * j, "prefill_ms": 50.0, "decode_ms": 300.0}
                          for j in range(4)]} for i, r in enumerate((1.0, 4.0, 16.0))]
    panel = show(ComparisonPanel(), 1280, 900)
    panel.set_result(_result(knob="rate", metrics=["goodput_rps"], chart=["goodput_rps"], comparison=rows))
    assert panel.split.isVisible() and panel.curve.isVisible()
    assert panel.split._title.startswith("each request's time at rate=16.0")
    panel.set_result(_result())
    assert not panel.split.isVisible()


def test_chart_first_for_the_projector(show):
    panel = show(ComparisonPanel(), 600, 700)
    layout = panel._content_layout
    assert layout.indexOf(panel.table) < layout.indexOf(panel.bars)
    panel.set_chart_first(True)
    assert layout.indexOf(panel.split) < layout.indexOf(panel.provenance) < layout.indexOf(panel.table) \
        < layout.indexOf(panel.notes)
    panel.set_chart_first(False)
    # 0: the title row, 1: the chapter check's flag (issue 27), then when/where and the table
    assert layout.indexOf(panel.flag) == 1
    assert layout.indexOf(panel.provenance) == 2 and layout.indexOf(panel.table) == 3
    assert layout.indexOf(panel.table) < layout.indexOf(panel.bars)


def test_fit_chart_shows_the_curve_and_the_measured_line_without_scrolling(show):
    rows = [{"label": f"rate={r}", "config": {"rate": r}, "metrics": {"goodput_rps": r / 2},
             "requests": [{"id": f"c{i}-{j}", "queue_ms": 10.0 * j, "prefill_ms": 50.0, "decode_ms": 300.0}
                          for j in range(10)]} for i, r in enumerate((1.0, 4.0, 16.0))]
    panel = show(ComparisonPanel(), 630, 500)
    panel.set_chart_first(True)
    panel.set_result(_result(knob="rate", metrics=["goodput_rps"], chart=["goodput_rps"], comparison=rows))
    QApplication.processEvents()  # the scroll area lays its content out
    assert panel.chart_height() > panel.height()  # the curve at pyqtgraph's own height pushes the rest down
    panel.fit_chart(panel.height())
    assert panel.chart_height() <= panel.height()
    assert panel.curve.height() >= panel._curve_least
    shrunk = panel.curve.height()
    panel.fit_chart(panel.height() + 100)  # more room: the curve takes it back
    QApplication.processEvents()
    assert panel.curve.height() > shrunk
    panel.set_chart_first(False)  # off the projector: no limit left behind
    assert panel.curve.maximumHeight() > 10_000 and panel.curve.minimumHeight() == panel._curve_least
