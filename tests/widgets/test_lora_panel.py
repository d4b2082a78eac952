"""LoraPanel against synthetic events: pool slots and counters, the batch mix per step by adapter, the
side-by-side answers; the token stream and the Gantt chart carry each request's adapter colour."""
from __future__ import annotations

from PySide6.QtCore import QPoint

from engine.events import LoraPoolEvent, LoraPoolSnapshot, StepStats
from widgets.gantt import GanttView
from widgets.lora_panel import OFF_TEXT, AdapterRow, LoraPanel
from widgets.theme import adapter_color
from widgets.token_stream import TokenStreamPanel


def _step(i: int, scheduled: list[tuple[str, str | None]]) -> StepStats:
    return StepStats(step=i, t_start=10 + 0.05 * i, wall_time_s=0.04, num_prefill_tokens=0,
                     num_decode_tokens=len(scheduled), num_running=len(scheduled), num_waiting=0, num_preempted=0,
                     kv_blocks_used=1, kv_blocks_total=10, scheduled=tuple((r, 1, "decode") for r, _ in scheduled),
                     scheduled_loras=tuple(n for _, n in scheduled))


def _pool(slots, host=(), loads=0, evictions=0) -> LoraPoolSnapshot:
    return LoraPoolSnapshot(device_slots=tuple(slots), host=tuple(host), num_hits=3, num_loads=loads,
                            num_evictions=evictions, device_bytes=2 << 20, host_bytes=4 << 20)


def test_pool_mix_and_answers(show):
    panel = show(LoraPanel(), 700, 800)
    assert panel.overlay_text() == OFF_TEXT  # no pool, no adapters: says so
    panel.set_adapters([AdapterRow("pirate", 8, ("q_proj",), 5 << 20, "shipped"),
                        AdapterRow("shout", 8, ("q_proj",), 5 << 20, "shipped")])
    load = LoraPoolEvent("load", "pirate", slot=0, source="host", seconds=0.002)
    panel.add_step(_step(1, [("r1", "pirate"), ("r2", None)]), (load,), _pool(["pirate", None], ["shout"], loads=1))
    panel.add_step(_step(2, [("r1", "pirate"), ("r2", None), ("r3", "shout")]),
                   (LoraPoolEvent("evict", "pirate", slot=0), LoraPoolEvent("load", "shout", slot=0, source="host")),
                   _pool(["shout", None], ["pirate"], loads=2, evictions=1))
    panel.flush()
    data = panel.snapshot_data()
    assert panel.overlay_text() == ""
    assert data["device_slots"] == ["shout", None] and data["host"] == ["pirate"]
    assert (data["loads"], data["evictions"]) == (2, 1)
    assert data["rows_by_adapter"] == {"pirate": 2, "base": 2, "shout": 1}
    assert [k for k, _ in data["events"]] == ["load", "evict", "load"]
    assert "evictions <b>1</b>" in data["summary"] and "pirate: rank 8" in panel._summary.toolTip()
    asked = []
    panel.sigAskAll.connect(asked.append)
    panel._ask.click()
    assert asked and asked[0]
    panel.begin_side_by_side({"q1": None, "q2": "pirate", "q3": "shout"})
    assert panel.wants("q2") and not panel.wants("r1")
    panel.append_answer("q2", "Ahoy")
    panel.append_answer("q2", " matey")
    panel.append_answer("q3", "HELLO")
    panel.flush()
    answers = panel.snapshot_data()["answers"]
    assert answers == {"q1": ("base", ""), "q2": ("pirate", "Ahoy matey"), "q3": ("shout", "HELLO")}
    panel.reset()
    assert panel.snapshot_data()["num_steps"] == 0 and panel.overlay_text() == OFF_TEXT


def test_token_stream_and_gantt_carry_the_adapter(show):
    tokens = show(TokenStreamPanel(), 500, 400)
    tokens.add_stream("req-1", "req-1 (poisson)", "prompt", adapter="pirate")
    tokens.add_stream("req-2", "req-2 (poisson)", "prompt")
    tokens.flush()
    streams = tokens.snapshot_data()["streams"]
    assert streams["req-1"]["adapter"] == "pirate" and "pirate" in streams["req-1"]["title"]
    assert streams["req-2"]["adapter"] is None
    assert tokens._tabs.tabBar().tabTextColor(0) == adapter_color("pirate")
    gantt = show(GanttView(), 500, 300)
    gantt.add_step(_step(1, [("req-1", "pirate"), ("req-2", None)]))
    assert gantt.snapshot_data()["adapters"] == {"req-1": "pirate"}
    assert "LoRA adapter: pirate" in gantt.tooltip_at(QPoint(gantt.width() - 10, 2))  # the first row
    gantt.grab()  # paints the adapter stripes without error
    assert adapter_color(None) != adapter_color("pirate") != adapter_color("shout")
