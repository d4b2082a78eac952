"""A preset's live load scaled to the capacity measured now (issue 49, point 3): 6 of 15 presets grew an
endless queue on a busy 2-core machine while the same preset kept up alone. The rate follows min(preset,
70 % of the requests/s the engine's own steps served), re-scaled when the machine frees, and a rate the
user sets is left alone."""
from __future__ import annotations

import types

from app.gui.live_scale import SHARE, LiveScale


class Ctl:
    def __init__(self) -> None:
        self.state = types.SimpleNamespace(arrival_rate=0.0)
        self.load_running = True
        self.said: list[str] = []

    def scale_arrival_rate(self, rate: float, said: str) -> None:
        self.state.arrival_rate = rate
        self.said.append(said)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def feed(scale: LiveScale, t0: float, seconds: float, requests_per_busy_s: float, busy: float = 1.0,
         waiting: int = 3) -> float:
    """Steps of 0.1 s every 0.1 / busy s (the engine busy that share of the time), finishing requests at the
    given rate per second of work, `waiting` in the queue after each."""
    t, owed = t0, 0.0
    while t < t0 + seconds:
        owed += 0.1 * requests_per_busy_s
        done = int(owed)
        owed -= done
        scale.add_step(types.SimpleNamespace(t_start=t, wall_time_s=0.1, num_finished=done, num_waiting=waiting))
        t += 0.1 / busy
    scale._clock.now = t
    return t


def scaling_at(rate: float) -> tuple[Ctl, LiveScale]:
    ctl, scale = Ctl(), LiveScale(None, clock=Clock())
    scale._ctl = ctl
    scale.start(rate)
    ctl.state.arrival_rate = rate
    return ctl, scale


def test_a_busy_machine_scales_the_rate_down_and_a_freed_one_back_up(qapp):
    ctl, scale = scaling_at(1.0)
    t = feed(scale, 0.0, 30.0, 0.6)  # busy all the time, a queue: the engine serves 0.6 req/s, 1.0 would grow it
    scale.check()
    assert abs(ctl.state.arrival_rate - 0.4) < 1e-9  # 0.7 x 0.6 = 0.42, on the slider's 0.1 steps
    assert "0.60 req/s this engine serves now" in ctl.said[-1] and "the preset asks 1.0" in ctl.said[-1]
    t = feed(scale, t, 30.0, 1.0, busy=0.3, waiting=0)  # the machine freed up: up, to 70 % busy
    scale.check()
    assert abs(ctl.state.arrival_rate - 0.9) < 1e-9 and "raised to 0.9" in ctl.said[-1]  # 0.4 x 0.7 / 0.3
    feed(scale, t, 30.0, 1.0, busy=0.3, waiting=0)
    scale.check()
    assert ctl.state.arrival_rate == 1.0 and "back to the preset's" in ctl.said[-1]  # never above it
    assert SHARE == 0.7


def test_an_engine_that_keeps_up_is_never_slowed(qapp):
    """A small batch finishes fewer requests per second of work than a full one: a machine that keeps up
    (busy part of the time, nothing waiting) reads as a low capacity, and was scaled down for nothing."""
    ctl, scale = scaling_at(1.0)
    feed(scale, 0.0, 30.0, 1.1, busy=0.7, waiting=0)
    scale.check()
    assert ctl.state.arrival_rate == 1.0 and ctl.said == []


def test_too_few_requests_leave_the_rate_alone_and_the_user_has_the_last_word(qapp):
    ctl, scale = scaling_at(1.0)
    feed(scale, 0.0, 2.0, 0.6)
    scale._clock.now = 2.0
    scale.check()
    assert ctl.state.arrival_rate == 1.0 and ctl.said == []  # not yet known
    feed(scale, 2.0, 30.0, 0.6)
    scale.user_set()  # the slider moved
    scale.check()
    assert ctl.state.arrival_rate == 1.0 and ctl.said == []
    ctl.load_running = False
    scale.start(1.0)
    feed(scale, scale._clock.now, 30.0, 0.6)
    scale.check()
    assert ctl.said == []  # no load running: nothing to scale


def test_the_controller_scales_and_the_slider_takes_over(qapp, tiny_llama):
    from app_helpers import close_window, open_window

    w = open_window(tiny_llama, preset="continuous-batching")
    try:
        ctl = w.controller
        assert ctl.live_scale.preset_rate == 1.0
        ctl.scale_arrival_rate(0.4, "live load scaled")
        assert ctl.state.arrival_rate == 0.4 and w.status_label.text() == "live load scaled"
        assert ctl.live_scale.preset_rate == 1.0  # still scaling
        w.panels.controls.sigLoadChanged.emit({"arrival_rate": 2.0})  # the user's slider
        assert ctl.state.arrival_rate == 2.0 and ctl.live_scale.preset_rate is None
        from app.gui.tradeoff_actions import run_sweep_load

        ctl.live_scale.start(1.0)
        run_sweep_load(ctl, 8)  # the explorer's "Run the sweep's load": its batch always in flight
        load = ctl.presets.load_config()
        assert (load.arrival_rate, load.num_users, load.think_time_s) == (0.0, 8, 0.0) and ctl.load_running
        assert ctl.live_scale.preset_rate is None  # a load the user chose: not scaled
    finally:
        close_window(w)
