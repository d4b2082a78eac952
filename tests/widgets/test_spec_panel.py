"""SpecPanel: an honest "off" state, rolling acceptance, per-position acceptance, predicted vs measured."""
from __future__ import annotations

import pytest
from widget_fakes import spec_stats

from engine.events import SpecDecodeStats
from widgets.spec_panel import OFF_TEXT, SpecPanel, rolling_ratio


@pytest.fixture
def panel(show):
    return show(SpecPanel(window_steps=10), 800, 600)


def test_off_without_stats(panel):
    panel.flush()
    assert panel.overlay_text() == OFF_TEXT == "Speculative decoding: off"
    assert panel._overlay.isVisible()
    data = panel.snapshot_data()
    assert data["off"] and data["acceptance_rate"] is None and data["num_steps"] == 0
    assert len(panel._rate_curve.getData()[0] or []) == 0  # nothing drawn underneath


def test_off_when_method_is_none(panel):
    panel.add_spec_stats(SpecDecodeStats(step=0, method=None, num_draft_tokens=0, num_accepted_tokens=0,
                                         num_emitted_tokens=0, num_verify_passes=0))
    panel.flush()
    assert panel.overlay_text() == OFF_TEXT and panel.snapshot_data()["num_steps"] == 0


def test_acceptance_numbers(panel):
    # 2 verify passes, k = 3: drafted 2/2/1 per position, accepted 2/1/0
    for i in range(3):
        panel.add_spec_stats(SpecDecodeStats(step=i, method="ngram", num_draft_tokens=5, num_accepted_tokens=3,
                                             num_emitted_tokens=5, num_verify_passes=2,
                                             accepted_per_position=(2, 1, 0), drafted_per_position=(2, 2, 1),
                                             predicted_speedup=1.8))
    panel.set_measured_speedup(1.5)
    panel.flush()
    assert panel.overlay_text() == "" and not panel._overlay.isVisible()
    data = panel.snapshot_data()
    assert data["method"] == "ngram" and data["num_steps"] == 3
    assert data["acceptance_rate"] == pytest.approx(0.6)
    assert data["per_position"] == pytest.approx([1.0, 0.5, 0.0])
    assert data["tokens_per_step"] == pytest.approx(2.5)
    assert data["predicted_speedup"] == 1.8 and data["measured_speedup"] == 1.5
    summary = panel._summary.text()
    assert "acceptance <b>60%</b>" in summary and "<i>predicted</i> 1.80×" in summary and "1.50×" in summary
    assert panel._speed_text[0].textItem.toPlainText() == "predicted\n1.80×"
    assert list(panel._pos_bars.opts["height"]) == pytest.approx([100.0, 50.0, 0.0])


def test_rolling_window_and_reset(panel):
    for i in range(40):
        panel.add_spec_stats(spec_stats(i, accept_prob=0.9 if i < 20 else 0.2))
    panel.flush()
    x, y = panel._rate_curve.getData()
    assert len(x) == 40 and y[15] > y[-1]  # the window forgets the good early steps
    panel.reset()
    panel.flush()
    assert panel.overlay_text() == OFF_TEXT


def test_unavailable_reason_wins(panel):
    panel.add_spec_stats(spec_stats(0))
    panel.set_available(False, "needs a draft model")
    assert panel.overlay_text() == "needs a draft model"
    panel.set_available(True)
    panel.flush()
    assert panel.overlay_text() == ""


def test_rolling_ratio():
    import numpy as np
    r = rolling_ratio(np.array([1, 1, 0, 0]), np.array([2, 2, 2, 0]), 2)
    assert list(r) == pytest.approx([0.5, 0.5, 0.25, 0.0])


def test_compared_speedup_stands_in_until_a_live_one_is_measured(panel):
    from app.talk.compare.headline import speculation_speedup

    result = {"measured_at": "2026-11-30T17:25:00+00:00", "comparison": [
        {"label": "off", "config": {"mode": "continuous"}, "metrics": {"tokens_per_s": 36.7}},
        {"label": "n-gram", "config": {"num_speculative_tokens": 4}, "metrics": {"tokens_per_s": 66.8}}]}
    assert speculation_speedup(result) == pytest.approx(66.8 / 36.7)
    assert speculation_speedup({"comparison": result["comparison"][::-1]}) is None  # not off-then-on
    panel.set_compared_speedup(speculation_speedup(result), "comparison 2026-11-30")
    panel.add_spec_stats(SpecDecodeStats(step=0, method="ngram", num_draft_tokens=4, num_accepted_tokens=2,
                                         num_emitted_tokens=3, num_verify_passes=1, accepted_per_position=(1, 1),
                                         drafted_per_position=(2, 2)))
    panel.reset()  # a preset's reset keeps the comparison's figure
    panel.add_spec_stats(SpecDecodeStats(step=1, method="ngram", num_draft_tokens=4, num_accepted_tokens=2,
                                         num_emitted_tokens=3, num_verify_passes=1, accepted_per_position=(1, 1),
                                         drafted_per_position=(2, 2)))
    panel.flush()
    assert "measured <b>1.82× (comparison 2026-11-30)</b>" in panel._summary.text()
    panel.set_measured_speedup(1.5)  # measured live in this session: that one wins
    panel.flush()
    assert "measured <b>1.50×</b>" in panel._summary.text()


def test_summary_names_the_draft_length_the_engine_chose(panel):
    """With the draft length picked per step (engine/spec/draft_length.py) the summary's k is the latest
    choice, not the longest draft in the window."""
    for i, chosen in enumerate((3, 1)):
        panel.add_spec_stats(SpecDecodeStats(step=i, method="ngram", num_draft_tokens=chosen, num_accepted_tokens=1,
                                             num_emitted_tokens=2, num_verify_passes=1,
                                             accepted_per_position=(1,), drafted_per_position=(1,) * chosen,
                                             draft_length=chosen))
    panel.flush()
    assert panel.snapshot_data()["draft_length"] == 1
    assert "k = 1 ·" in panel._summary.text()


def test_a_short_speedup_plot_puts_its_figures_under_the_bars(show):
    """At 720 lines the speed-up plot is ~40 px tall: the two-line labels above its bars ran into its title."""
    from widgets.spec_panel import SpecPanel

    panel = show(SpecPanel(), 520, 260)
    panel.set_measured_speedup(1.51)
    for i in range(3):
        panel.add_spec_stats(spec_stats(i))
    panel.flush()
    ticks = panel._speed_plot.getPlotItem().getAxis("bottom")._tickLevels[0]
    assert not panel._speed_text[1].isVisible() and any("1.51×" in t for _x, t in ticks)
    fm = panel.fontMetrics()
    room = panel._speed_plot.getPlotItem().vb.width() / 2.2  # the two names apart on their axis
    assert all(fm.horizontalAdvance(t) < room for _x, t in ticks), ticks
