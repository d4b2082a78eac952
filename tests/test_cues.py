"""Preset cues: parsed with clear errors, handed out once per period, the N key plays the next at once."""
from __future__ import annotations

import pytest

from app.talk.cues import Cue, CueTimeline, parse_cues


def _table(period=0, *entries):
    return {"every_s": period, "at": list(entries)}


def test_parse_sorts_by_time_and_checks_values():
    cues, period = parse_cues(_table(30, {"at_s": 20, "set": {"enable_chunked_prefill": True}},
                                     {"at_s": 5, "burst": 3, "note": "three long prompts"}))
    assert period == 30.0
    assert [c.at_s for c in cues] == [5.0, 20.0]
    assert cues[0].describe() == "three long prompts"
    assert cues[1].describe() == "enable_chunked_prefill = True"
    (ask,), _ = parse_cues(_table(0, {"at_s": 3, "ask": " Tell me about the moon. "}))
    assert ask.ask == "Tell me about the moon." and "every adapter answers" in ask.describe()


@pytest.mark.parametrize("table, where", [
    (_table(10, {"at_s": 12, "burst": 1}), "beyond the period"),
    (_table(0, {"at_s": -1, "burst": 1}), "at_s"),
    (_table(0, {"at_s": 1}), "needs a burst, a set, an ask or a note"),
    (_table(0, {"at_s": 1, "set": {"max_num_seqs": "many"}}), "set.max_num_seqs: expected an integer in \\[1, 256\\]"),
    (_table(0, {"at_s": 1, "set": {"max_num_seqs": True}}), "set.max_num_seqs: expected an integer in \\[1, 256\\]"),
    (_table(0, {"at_s": 1, "set": {"kv_blocks": 3}}), "set.kv_blocks: not a knob"),
    (_table(0, {"at_s": 1, "burst": 999}), "burst"),
    ({"every": 3}, "every: unknown key"),
    (_table(-5), "every_s"),
    (_table(0, {"at_s": 1, "ask": 5}), "ask: expected the prompt"),
])
def test_bad_cues_name_the_key(table, where):
    with pytest.raises(ValueError, match=where):
        parse_cues(table)


def test_due_once_per_period_in_order():
    a, b = Cue(at_s=2, burst=1), Cue(at_s=5, note="b")
    t = CueTimeline((a, b), period_s=10)
    assert t.due(1.9) == []
    assert t.due(2.0) == [a]
    assert t.due(4.0) == []
    assert t.due(12.5) == [b, a]  # the first lap's b, then the second lap's a
    assert t.due(100.0)[:2] == [b, a]


def test_once_without_period_and_next_cue_jumps():
    a, b = Cue(at_s=2, burst=1), Cue(at_s=5, note="b")
    t = CueTimeline((a, b), period_s=0)
    assert t.next_cue() == (a, 2.0)
    assert t.due(3.0) == []  # a was played by the key
    assert t.due(5.0) == [b]
    assert t.due(1e9) == []
    assert t.next_cue() == (None, 0.0)
    t.restart()
    assert t.due(5.0) == [a, b]
