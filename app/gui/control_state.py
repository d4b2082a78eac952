"""ControlState: what the controller and its parts (PresetActions, the cue player) share: the configuration
the user asked for, what the engine source offers, and the preset on screen. Owned by AppController and
handed to each part explicitly, so a part's dependencies are its constructor's arguments."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from app.source.engine_info import Capabilities
from app.talk import presets
from engine.events import SpecMethod


@dataclass(slots=True)
class ControlState:
    config: dict  # the knobs the user asked for (starts from app/talk/knob_defaults.py)
    arrival_rate: float
    source_name: str
    start_kv_blocks: int | None  # presets without num_kv_blocks go back to it
    # the other Load generator sliders (LoadConfig fields by name) as the user set them since the preset
    load_values: dict = field(default_factory=dict)
    capabilities: Capabilities = field(default_factory=Capabilities)  # none until the source says
    preset: presets.Preset | None = None
    presets_dir: Path = presets.PRESETS_DIR
    spec_method: SpecMethod | None = None
    engine_bits: int = 16  # what the engine's weights are now
    engine_ready: bool = False  # on_loaded ran: presets and controls reach the engine
    measuring: bool = False  # a comparison runs in the engine thread
    rebuilt_for_knob: bool = False  # the rebuild under way was asked by a slider (not a preset)
    server_point: dict = field(default_factory=dict)  # a managed server's restartable knobs, as it runs now
    budget_s: tuple[float, float] | None = None  # the latency budget on the sliders: (TTFT s, TPOT s)
    serve_budget: bool = False  # the scheduler serves toward that budget (engine ttft/tpot_budget_ms)


class ControllerVerbs(Protocol):
    """What PresetActions asks of the controller: its own verbs, nothing of its fields."""

    def push_config(self) -> None: ...
    def sync_actions(self) -> None: ...
    def set_load_running(self, running: bool) -> None: ...
    def error(self, message: str, title: str = "inferlab") -> None: ...
