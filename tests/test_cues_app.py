"""A preset's cues play in the app: the burst arrives, the knob turns, the caption and timeline say so;
N plays the next one at once; a broken cue is a preset error with its line."""
from __future__ import annotations

import pytest
from app_helpers import close_window, open_window, run_for, wait_until

from app.talk import presets

PRESET = """\
[preset]
title = "Cue test"
caption = "cues"
panels = ["timeline"]

[engine]
max_num_seqs = 4

[workload]
arrival_rate = 0.0
burst_size = 2
burst_prompt_tokens = [8, 16]
burst_output_tokens = [4, 8]
autostart = true

[cues]
every_s = 0

[[cues.at]]
at_s = 0.3
burst = 2
note = "two long prompts arrive"

[[cues.at]]
at_s = 0.8
set = { max_num_seqs = 2, enable_chunked_prefill = false }

[[cues.at]]
at_s = 600
note = "far away: only N plays it"
"""


def test_cues_play_on_time_and_on_the_key(qapp, tiny_llama, tmp_path):
    path = tmp_path / "cued.toml"
    path.write_text(PRESET)
    w = open_window(tiny_llama, preset=str(path))
    try:
        ctl = w.controller
        wait_until(qapp, lambda: len(ctl.cues.played) >= 2, timeout_s=30)
        assert ctl.cues.played[:2] == ["two long prompts arrive", "max_num_seqs = 2, enable_chunked_prefill = False"]
        wait_until(qapp, lambda: w.host.engine.config.max_num_seqs == 2, timeout_s=10)
        assert w.host.engine.config.enable_chunked_prefill is False
        assert ctl.config["max_num_seqs"] == 2
        assert w.caption.snapshot_data()["cue"] == "▶ max_num_seqs = 2, enable_chunked_prefill = False"
        marks = [text for _x, text, _lines in w.panels.timeline._marks]
        assert "cue: two long prompts arrive" in marks
        wait_until(qapp, lambda: w.host.engine.stats().num_requests >= 2, timeout_s=10)  # the burst arrived
        ctl.next_cue()  # N: the 600 s cue now
        assert ctl.cues.played[-1] == "far away: only N plays it"
        ctl.next_cue()  # nothing left: says so, plays nothing
        assert len(ctl.cues.played) == 3
        ctl.set_load_running(False)  # Space: the cues stop with the load
        assert not ctl.cues.running and w.caption.snapshot_data()["cue"] == ""
        run_for(qapp, 0.1)
    finally:
        close_window(w)


def test_broken_cue_names_file_line_and_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(PRESET.replace("set = { max_num_seqs = 2, enable_chunked_prefill = false }",
                                   "set = { kv_blocks = 3 }"))
    with pytest.raises(presets.PresetError) as err:
        presets.load_preset(path)
    assert str(err.value).startswith(f"{path}:") and "set.kv_blocks: not a knob a cue can turn" in str(err.value)
