"""Presets: every file parses, opens and runs on the tiny model; broken ones name file, line and key."""
from __future__ import annotations

import pytest
from app_helpers import close_window, open_window, run_for, wait_until

from app.talk import presets
from app.talk.talk_order import load_talk

TALK = presets.available()  # the talk's order: presets/talk.toml (app/talk/talk_order.py)
GOOD = """\
[preset]
title = "T"
caption = "C"

[engine]
max_num_seqs = 4
"""


def test_the_talk_lists_every_preset_once_and_all_parse():
    talk = load_talk(presets.PRESETS_DIR)
    files = sorted(p.stem for p in presets.PRESETS_DIR.glob("*.toml") if p.name != "talk.toml")
    assert sorted(talk.chapters) == files and talk.names == talk.chapters  # every preset is a chapter, once
    assert TALK[0] == "prefill-vs-decode" and TALK[-1] == "tradeoff"  # the talk opens and ends as it says
    assert all(talk.titles.get(name, "").endswith("?") for name in TALK)  # each chapter names its question
    for name in TALK:
        p = presets.load_preset(name)
        assert p.title and p.caption and set(p.panels) <= set(presets.PANEL_NAMES)
        assert p.autostart or p.burst, f"{name} would show nothing until a key is pressed"


def test_unbuilt_features_say_so():
    for name, word in (("quantization", "issue 5"), ("speculative", "issue 4"), ("multi-token", "issue 4"),
                       ("multi-lora", "LoRA")):  # capabilities a source may lack
        missing = presets.load_preset(name).unavailable(capabilities=frozenset())
        assert missing and word in " ".join(missing), name
    assert presets.load_preset("speculative").unavailable({"speculative"}) == []
    assert "train-mtp" in " ".join(presets.load_preset("multi-token").unavailable({"speculative"}))
    assert presets.load_preset("multi-token").unavailable({"speculative", "mtp"}) == []
    assert presets.load_preset("kv-cache").unavailable(frozenset()) == []
    assert presets.load_preset("multi-lora").unavailable({"lora"}) == []
    compilation = presets.load_preset("compilation")  # switched between steps like a scheduling knob
    assert compilation.unavailable(frozenset()) == [] and compilation.scheduling()["compile"] is True


@pytest.mark.parametrize("text, expected", [
    (GOOD.replace("max_num_seqs = 4", 'max_num_seqs = "many"'),
     ':6: [engine] max_num_seqs: expected an integer in [1, 256], got "many"'),
    (GOOD.replace("max_num_seqs = 4", "max_num_seqs = true"),
     ":6: [engine] max_num_seqs: expected an integer in [1, 256], got true"),
    (GOOD + "max_batch = 3\n", ":7: [engine] max_batch: unknown key; expected one of max_num_seqs"),
    (GOOD + "\n[workload]\nprompt_tokens = [50, 10]\n",
     ":9: [workload] prompt_tokens: expected [lo, hi], integers with 1 <= lo <= hi, got [50, 10]"),
    (GOOD + "\n[workload]\narrival_rate = -2\n", ":9: [workload] arrival_rate: expected a number >= 0, got -2"),
    (GOOD + "\n[budget]\nttft_ms = 0\n", ":9: [budget] ttft_ms: expected a number > 0, got 0"),
    (GOOD + "\n[engine2]\nx = 1\n", ":8: [engine2]: unknown section"),
    (GOOD.replace('caption = "C"\n', ""), ":1: [preset] caption: missing"),
    (GOOD + '\n[preset.extra]\n', ":8: [preset] extra: unknown key"),
    (GOOD + "max_num_seqs = 5\n", ":7: not valid TOML"),
    (GOOD.replace('title = "T"', 'title = "T'), ":2: not valid TOML"),
    (GOOD.replace("[engine]", '[engine]\npolicy = "lifo"'), ":6: [engine] policy: expected one of 'fcfs'"),
])
def test_broken_preset_errors_name_file_line_and_key(tmp_path, text, expected):
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(presets.PresetError) as err:
        presets.load_preset(str(path))
    message = str(err.value)
    assert message.startswith(str(path)) and expected in message, message


def test_unknown_preset_name_lists_the_known_ones():
    with pytest.raises(presets.PresetError, match="no-such-preset.toml: cannot read preset.*kv-cache"):
        presets.load_preset("no-such-preset")


def test_key_line_ignores_other_sections_and_comments():
    text = "# max_num_seqs = 1\n[workload]\nmax_num_seqs = 2\n[engine]\n  max_num_seqs=3 # x\n"
    assert presets.key_line(text, "engine", "max_num_seqs") == 5
    assert presets.key_line(text, "engine", None) == 4


def test_every_preset_opens_and_runs_then_a_broken_one_leaves_the_app_up(qapp, tiny_llama, tmp_path):
    window = open_window(tiny_llama, preset="kv-cache")
    ctl = window.controller
    try:
        for name in TALK:
            steps = window.feeder.num_steps
            assert ctl.apply_preset(name), ctl.last_error
            wait_until(qapp, lambda: ctl.engine_ready and not ctl.engine_busy, 30)  # rebuilds, requantizing
            ctl.burst(1)  # work now, whatever the preset's arrival rate
            # Count the engine's own steps: the feeder drains events in batches (at 4 Hz under load), so its
            # count can jump past a preset switch on events of earlier steps. The preset's knobs land at the
            # first step after it; compilation compiles first.
            engine, start = window.host.engine, window.host.engine.stats().num_steps
            wait_until(qapp, lambda e=engine, n=start, s=steps: (e.stats().num_steps > n + 3
                                                                 and window.feeder.num_steps > s), 45)
            run_for(qapp, 0.2)
            assert ctl.last_error is None, f"{name}: {ctl.last_error}"
            assert window.caption.snapshot_data()["title"] == presets.load_preset(name).title
            assert window.host.engine.config.max_num_seqs == presets.load_preset(name).engine["max_num_seqs"]
            assert window.host.engine.model.compiled == presets.load_preset(name).engine["compile"]
        broken = tmp_path / "broken.toml"
        broken.write_text(GOOD.replace("max_num_seqs = 4", 'max_num_seqs = "many"'))
        assert not ctl.apply_preset(str(broken))
        assert f"{broken}:6: [engine] max_num_seqs" in window.status_label.text()
        assert ctl.preset.name == TALK[-1]  # the previous preset stays
        steps = window.feeder.num_steps
        wait_until(qapp, lambda: window.feeder.num_steps > steps, 10)  # and the engine keeps going
        ctl.step_preset(+1)
        assert ctl.preset.name == TALK[0]  # PgDown after the last chapter: the first, in the talk's order
    finally:
        close_window(window)
