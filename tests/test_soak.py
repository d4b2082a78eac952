"""The soak verdict: a queue that keeps growing is told from one that comes and goes."""
from __future__ import annotations

from app.gui.soak import verdict


def _samples(waiting: list[int]) -> list[dict]:
    return [{"t_s": 5.0 * i, "waiting": w, "goodput_share": 1.0 if w < 4 else 0.5} for i, w in enumerate(waiting)]


def test_a_growing_queue_is_overload():
    v = verdict(_samples([0, 1, 2, 3, 5, 7, 9, 11, 13, 15, 18, 21]))
    assert v["verdict"] == "queue grows" and v["waiting_at_end"] == 21 and v["max_waiting"] == 21


def test_bursts_that_drain_keep_up():
    v = verdict(_samples([0, 6, 1, 0, 0, 7, 2, 0, 0, 6, 1, 0]))  # a burst every minute, served each time
    assert v["verdict"] == "keeps up" and v["max_waiting"] == 7 and v["goodput_share_at_end"] == 1.0


def test_a_short_run_says_so():
    assert verdict(_samples([0, 5]))["verdict"] == "too short to tell"
