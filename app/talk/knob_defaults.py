"""The knobs' starting values, from where each one is defined: the knobs with a slider or a preset key from the
knob table (engine/knobs.py), the arrival rate and what each request samples with from LoadConfig's, the burst
size and latency budget from a preset's. The controller starts from these and hands them to the controls panel
as data (the panel draws its sliders from the table itself)."""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from app.load.generator import LoadConfig
from app.talk.presets import Preset
from engine.knobs import KNOBS, Box, KnobValues, Layer, Use, knob_subset


def engine_knob_defaults() -> KnobValues:
    """The engine knobs the controller keeps (what the user asked for): every engine row with a slider in the
    Engine box or a preset key, at the table's default (the latency budget is kept apart: ControlState.budget_s)."""
    kept = [k.name for k in KNOBS if k.layer == Layer.ENGINE and (k.slider == Box.ENGINE or Use.PRESET in k.uses)]
    return knob_subset({k.name: k.default for k in KNOBS}, kept)


def knob_defaults() -> dict:
    """Every value the controls panel shows, as it starts and after a reset."""
    preset: dict[str, Any] = {f.name: f.default for f in fields(Preset)}
    load = LoadConfig()  # the Load generator's rows: the arrival rate and what each request samples with
    return {**engine_knob_defaults(), "arrival_rate": load.arrival_rate, **load.sampling(),
            "burst_size": preset["burst_size"], "ttft_budget_ms": preset["ttft_s"] * 1e3,
            "tpot_budget_ms": preset["tpot_s"] * 1e3}
