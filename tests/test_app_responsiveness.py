"""With the engine under load, the GUI event loop never freezes (a 10 ms QTimer probe).

The target itself (p99 under 100 ms) lives in `inferlab bench gui`, which reports the event loop's delay
percentiles; this test guards against a freeze with margins that hold on a loaded 2-core machine (seen
here: p99 160-356 ms while other work ran; a GUI blocked by the engine shows gaps of seconds)."""
from __future__ import annotations

import time

import numpy as np
from app_helpers import close_window, open_window, run_for
from PySide6.QtCore import QTimer

PROBE_MS = 10


def test_event_loop_delay_p99_under_load(qapp, tiny_llama):
    window = open_window(tiny_llama, preset="latency-budget")
    try:
        ctl = window.controller
        ctl.set_arrival_rate(20.0)
        ctl.burst(16)
        run_for(qapp, 0.5)  # the queue fills up
        steps_before = window.feeder.num_steps
        stamps: list[float] = []
        probe = QTimer()
        probe.setInterval(PROBE_MS)
        probe.timeout.connect(lambda: stamps.append(time.perf_counter()))
        probe.start()
        run_for(qapp, 3.0)
        probe.stop()
        delays_ms = (np.diff(stamps) * 1e3) - PROBE_MS
        p99 = float(np.percentile(delays_ms, 99))
        steps = window.feeder.num_steps - steps_before
        print(f"event-loop delay p50 {np.percentile(delays_ms, 50):.1f} ms, p99 {p99:.1f} ms, "
              f"max {delays_ms.max():.1f} ms over {len(stamps)} ticks; {steps} engine steps")
        assert steps > 50, "the engine was not under load"
        assert len(stamps) > 100
        assert p99 < 750.0 and delays_ms.max() < 3000.0
    finally:
        close_window(window)
