"""The multi-LoRA chapter in the app, on a tiny model: a preset mixes base and adapter requests found by
name; the token stream, the Gantt chart and the LoRA panel show each request's adapter; the pool loads and
evicts through too few slots; one prompt goes to every adapter at once; a missing adapter is said and
left out of the mix while the others run."""
from __future__ import annotations

from app_helpers import close_window, open_window, wait_until
from lora_helpers import make_adapter

from engine.lora.shipped import trained_dir

PRESET = """\
[preset]
title = "LoRA test"
caption = "base and two adapters"
panels = ["lora", "tokens", "timeline"]

[engine]
max_loras = 1
max_num_seqs = 8

[workload]
arrival_rate = 6.0
output_tokens = [4, 8]
lora_mix = ["base", "alpha", "beta", "missing"]
instructions = true
temperature = 0.0
autostart = true
"""


def test_multi_lora_preset_in_the_app(qapp, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    folder = trained_dir(str(tiny_llama))
    make_adapter(tiny_llama, folder / "alpha", rank=4, seed=1)
    make_adapter(tiny_llama, folder / "beta", rank=4, seed=2, targets=["q_proj", "v_proj"])
    path = tmp_path / "lora.toml"
    path.write_text(PRESET)
    w = open_window(tiny_llama, preset=str(path))
    try:
        lora, tokens, timeline = w.panels.lora, w.panels.tokens, w.panels.timeline
        wait_until(qapp, lambda: w.host.info.config.get("max_loras") == 1, timeout_s=60)  # rebuilt with a pool
        wait_until(qapp, lambda: lora.snapshot_data()["adapters"] == ["alpha", "beta"], timeout_s=30)
        assert w.host.loadgen.config.lora_mix == ("base", "alpha", "beta")  # the missing one left out
        wait_until(qapp, lambda: lora.snapshot_data()["loads"] >= 2 and lora.snapshot_data()["evictions"] >= 1,
                   timeout_s=60)
        for p in (lora, tokens, timeline):
            p.flush()
        data = lora.snapshot_data()
        assert lora.overlay_text() == "" and len(data["device_slots"]) == 1
        assert {"alpha", "beta"} <= set(data["rows_by_adapter"])
        adapters = {s["adapter"] for s in tokens.snapshot_data()["streams"].values()}
        assert adapters & {"alpha", "beta"}
        assert set(timeline.snapshot_data()["gantt"]["adapters"].values()) & {"alpha", "beta"}
        w.controller.ask_every_adapter("Say hello")  # what the button and an `ask` cue do
        wait_until(qapp, lambda: len(lora.snapshot_data()["answers"]) == 3, timeout_s=30)
        wait_until(qapp, lambda: (lora.flush(), all(t for _n, t in lora.snapshot_data()["answers"].values()))[1],
                   timeout_s=60)
        assert sorted(n for n, _t in lora.snapshot_data()["answers"].values()) == ["alpha", "base", "beta"]
        assert w.isVisible()
    finally:
        close_window(w)
