"""The chapter's comparison in the app: M measures it in the engine thread on engines of its own (the
live panels see none of its load), the panel shows it, and reopening the preset shows the stored result."""
from __future__ import annotations

from app_helpers import close_window, open_window, wait_until

PRESET = """\
[preset]
title = "Comparison test"
caption = "static vs continuous"
panels = ["timeline", "latency"]

[engine]
max_num_seqs = 4

[workload]
arrival_rate = 0.0
autostart = false

[compare]
title = "static batches vs continuous batching"
metrics = ["tokens_per_s", "p99_e2e_ms"]
chart = ["tokens_per_s"]

[compare.engine]
max_num_seqs = 2

[compare.workload]
requests = 4
prompt_tokens = [8, 16]
output_tokens = [4, 8]
seed = 3

[[compare.configs]]
label = "static batches of 2"
mode = "static"

[[compare.configs]]
label = "continuous, 2 at a time"
"""


def test_measure_show_store_and_reopen(qapp, tiny_llama, tmp_path):
    path = tmp_path / "cmp.toml"
    path.write_text(PRESET)
    w = open_window(tiny_llama, preset=str(path))
    try:
        ctl, panel = w.controller, w.panels.comparison
        assert "comparison" in w._emphasised  # a preset with [compare] shows its comparison
        assert panel.snapshot_data()["labels"] == [] and "press M" in panel.snapshot_data()["provenance"]
        steps_before = w.host.engine.stats().num_steps
        live_requests = w.host.engine.stats().num_requests
        ctl.measure_comparison()
        wait_until(qapp, lambda: panel.snapshot_data()["labels"], timeout_s=120)
        data = panel.snapshot_data()
        assert data["labels"] == ["static batches of 2", "continuous, 2 at a time"]
        assert data["provenance"].startswith("measured ") and data["machine"]["cpu"]
        # isolation: the live engine ran no request of the comparison
        assert w.host.engine.stats().num_requests == live_requests
        assert w.host.engine.stats().num_steps - steps_before < 5
        wait_until(qapp, lambda: not ctl.measuring, timeout_s=10)
        panel.set_result(None)
        assert ctl.apply_preset(str(path))  # reopening: the stored result at once, nothing run
        assert panel.snapshot_data()["labels"] == data["labels"]
        assert panel.snapshot_data()["measured_at"] == data["measured_at"]
    finally:
        close_window(w)
