"""What the engine source cannot do, said on the controls and panels: each greyed out with why (before
loading nothing is known yet, so they wait greyed out). Read from the source's declared capabilities
(app/source/engine_info.py) and each panel's needs (app/talk/panel_specs.py)."""
from __future__ import annotations

from typing import cast

from app.gui.panels import Panels
from app.source.engine_info import Capabilities
from app.talk.panel_specs import PANEL_SPECS
from engine.knobs import Box, slider_knobs
from widgets.panel_base import Panel
from widgets.theme import phase_color

_SLIDERS = [row for box in Box for row in slider_knobs(box)]
FEATURE_CONTROLS = {  # control -> (capability, what is greyed out): the sliders whose knob needs one (engine/knobs.py)
    **{row.name: (row.needs, row.label[:1].upper() + row.label[1:]) for row in _SLIDERS if row.needs},
    "load": ("load_generator", "The load generator"),
    "burst": ("load_generator", "The load generator"),
}
# the engine's sliders that need no feature: changeable where the source reconfigures (or restarts) them
KNOB_CONTROLS = {row.name: row.label for row in slider_knobs(Box.ENGINE) if not row.needs}
GANTT_CLIENT_LEGEND = ("<b>requests</b> as the client saw them &nbsp; <span style='color:{queued}'>■</span> sent → "
                       "first token (queue and prefill: the server does not tell them apart) &nbsp; "
                       "<span style='color:{decode}'>■</span> streaming &nbsp; | finished")


# a recording greys every control: each slider of the table, the load buttons and the rest (each once)
RECORDED_CONTROLS = tuple(dict.fromkeys((*(row.name for row in _SLIDERS), *FEATURE_CONTROLS, "serve_budget", "reset")))


def recorded_control_values(knobs: dict) -> dict:
    """A recording's knobs as the controls show them: each slider's own knob, by its name in the table."""
    return {row.name: knobs[row.name] for row in _SLIDERS if knobs.get(row.name) is not None}


def grey_out_recorded(panels: Panels, source: str) -> None:
    """A recording: every control shows the run as it was, greyed, "recorded"."""
    for name in RECORDED_CONTROLS:
        panels.controls.set_feature_available(name, False, f"recorded: as the run had it ({source})")


def grey_out_features(panels: Panels, caps: Capabilities, source: str, engine_ready: bool) -> None:
    controls = panels.controls
    if caps.recorded:
        grey_out_recorded(panels, source)
        _panels_available(panels, caps, source)
        return
    for name, (cap, what) in FEATURE_CONTROLS.items():
        on = cap in caps or name in caps.restartable  # a managed server: by restarting it
        controls.set_feature_available(name, on, _by_restart(what, name, caps, source) if on
                                       else f"{what}: not offered by {source}")
    for name, label in KNOB_CONTROLS.items() if engine_ready else ():
        on = name in caps.reconfigurable or name in caps.restartable
        controls.set_feature_available(name, on, _by_restart(label, name, caps, source) if on else
                                       f"{label}: set when {source} starts; not changeable from a client")
    if engine_ready:
        on = "ttft_budget_ms" in caps.reconfigurable
        controls.set_feature_available("serve_budget", on, "" if on else
                                       f"Serving toward the budget: the scheduler of {source} is not changeable here")
        _panels_available(panels, caps, source)


# what a recording shows of the run's acting features: the points its steps made, the errors and comparisons it
# carries (nothing is run again)
RECORDED_SHOWS = frozenset({"sweep", "quantization"})


def _panels_available(panels: Panels, caps: Capabilities, source: str) -> None:
    shown = caps.names() | (RECORDED_SHOWS if caps.recorded else frozenset())
    for spec in PANEL_SPECS:
        if not spec.needs:
            continue
        missing = [what for cap, what in spec.needs if cap not in shown]
        why = f"{' and '.join(missing)}: not exposed by {source}" if missing else ""
        why = why[:1].upper() + why[1:]
        panel = panels.named(spec.name)
        if panel is panels.timeline and missing and caps.client_timings:  # the Gantt chart stays live
            panels.timeline.set_available(True)
            panels.timeline.set_steps_note(why, GANTT_CLIENT_LEGEND.format(
                queued=phase_color("queued").name(), decode=phase_color("decode").name()))
            continue
        if panel is panels.timeline:
            panels.timeline.set_steps_note("")
        cast(Panel, panel).set_available(not missing, why)


def _by_restart(what: str, name: str, caps: Capabilities, source: str) -> str:
    """The tooltip of a control that works: how, when it restarts a managed server."""
    if name in caps.restartable and name not in caps.reconfigurable:
        return f"{what}: by restart (moving it restarts {source} with the new flags)"
    return ""
