"""FrameGovernor: the panels' repaint interval follows the GUI thread's measured CPU share."""
from __future__ import annotations

import pytest

from app.gui.frame_governor import MAX_INTERVAL_MS, MIN_INTERVAL_MS, FrameGovernor
from widgets.timeline import TimelinePanel


@pytest.fixture
def governed(qtbot):
    panels = [TimelinePanel(), TimelinePanel()]
    for p in panels:
        qtbot.addWidget(p)
    gov = FrameGovernor(panels, target_share=0.05)
    gov.stop()  # the test feeds the measurements
    rates = []
    gov.sigRateChanged.connect(rates.append)
    yield gov, panels, rates


def test_slows_down_when_the_gui_costs_too_much_and_recovers(governed):
    gov, panels, rates = governed
    assert gov.observe(0.03) == MIN_INTERVAL_MS and rates == []  # within budget: unchanged
    assert gov.observe(0.075) == 75  # 1.5x over budget: 1.5x slower
    assert gov.observe(0.5) == 150  # far over: at most doubling per check
    assert all(p._repaint_timer.interval() == 150 for p in panels)
    for _ in range(10):
        gov.observe(0.9)
    assert gov.interval_ms == MAX_INTERVAL_MS and gov.rate_hz == pytest.approx(1000 / MAX_INTERVAL_MS)
    gov.observe(0.04)  # between half the target and the target: hold
    assert gov.interval_ms == MAX_INTERVAL_MS
    for _ in range(30):
        gov.observe(0.01)  # room again: back to 20 Hz
    assert gov.interval_ms == MIN_INTERVAL_MS and panels[1]._repaint_timer.interval() == MIN_INTERVAL_MS
    assert rates[0] == pytest.approx(1000 / 75) and rates[-1] == pytest.approx(20.0)


def test_measures_its_own_thread(governed, qapp):
    gov, _panels, _rates = governed
    gov._cpu -= 0.5  # as if the GUI thread had burnt half a second since the last check
    gov._wall -= 1.0
    gov._on_check()
    assert gov.last_share == pytest.approx(0.5, abs=0.05) and gov.interval_ms == 2 * MIN_INTERVAL_MS


def test_panels_repaint_at_spread_phases(qtbot):
    """After a rate change the panels' timers restart at phases spread over the interval, so one long
    pass that paints every panel becomes several short ones (the event loop's p99 delay halves)."""
    import time

    from app_helpers import run_for
    from PySide6.QtWidgets import QApplication

    panels = [TimelinePanel() for _ in range(4)]
    fired: dict[int, list[float]] = {i: [] for i in range(4)}
    for i, p in enumerate(panels):
        qtbot.addWidget(p)
        p.show()
        p._repaint_timer.timeout.connect(lambda i=i: fired[i].append(time.perf_counter()))
    gov = FrameGovernor(panels, target_share=0.05)
    gov.stop()
    run_for(QApplication.instance(), 0.3)  # the first paints are done: the phases are not swallowed by them
    for times in fired.values():
        times.clear()
    gov.observe(0.2)  # 4x over budget: twice slower, 100 ms
    run_for(QApplication.instance(), 0.6)
    assert all(p._repaint_timer.interval() == 100 for p in panels)
    first = [fired[i][0] for i in range(4)]
    gaps = [b - a for a, b in zip(first, first[1:])]
    assert all(g > 0.01 for g in gaps), gaps  # 25 ms apart, in panel order (not all in one pass)
    panels[3].hide()
    gov.observe(0.5)  # a hidden panel is not restarted by its delayed start
    run_for(QApplication.instance(), 0.3)
    assert not panels[3]._repaint_timer.isActive() and panels[0]._repaint_timer.isActive()
