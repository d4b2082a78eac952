"""The sliders on a managed server (app/managed/source.py): batch, weight bits and draft length take
a restart of the server with its own flags. A part of AppController: it hands the restartable knobs to the
source (which coalesces a burst of moves into one restart, off the GUI thread), marks the change on the
timeline, and when the restart ends shows what runs now: the sliders go back to the last good point
when the asked one failed, with the reason and the server's log tail in a message."""
from __future__ import annotations

from app.gui.control_state import ControllerVerbs, ControlState
from app.gui.panels import Panels

KNOB_LABELS = {"max_num_seqs": "max batch", "quant_bits": "weight bits", "num_speculative_tokens": "draft length"}
LOG_TAIL_LINES = 12


class ServerRestarts:
    def __init__(self, window, host, panels: Panels, state: ControlState, verbs: ControllerVerbs) -> None:
        self.window, self.host, self.panels, self.state, self.verbs = window, host, panels, state, verbs

    def take(self, values: dict) -> dict:
        """Send the restartable knobs among `values` to the source; returns the others."""
        restartable = self.state.capabilities.restartable if self.state.engine_ready else ()
        if not restartable:
            return values
        changes = {k: v for k, v in values.items() if k in restartable and self.state.config.get(k) != v}
        if changes:
            try:
                self.host.reconfigure(**changes)
            except (ValueError, RuntimeError) as exc:
                self.verbs.error(str(exc))
            else:
                self.panels.timeline.mark_config_change(", ".join(
                    f"{KNOB_LABELS.get(k, k)} {self.state.config.get(k)} → {v}" for k, v in changes.items()))
                self.state.config.update(changes)
        return {k: v for k, v in values.items() if k not in restartable}

    def on_loaded(self, info) -> None:
        """The server's own point is what the sliders show (a preset's engine settings do not restart it)."""
        restartable = info.capabilities.restartable
        self.state.server_point = {k: info.config[k] for k in restartable if k in info.config}
        self._show_point()

    def on_restarted(self, item) -> None:
        self.state.server_point = dict(item.knobs)
        self._show_point()
        name = self.host.engine_name
        if not item.failed:
            self.window.show_message(f"{name} restarted: {item.command}")
            return
        tail = "\n".join(item.log_tail.splitlines()[-LOG_TAIL_LINES:])
        shown_tail = f"\n\nIts last log lines:\n{tail}" if tail and tail not in item.failed else ""
        kept = (f"Kept the last good point: {item.command}" if item.command else
                f"{name} is not running now: move a slider to start it at another point")
        self.verbs.error(f"{name} did not restart at the asked point: {item.failed}{shown_tail}\n\n{kept}",
                         title=f"{name} restart failed")

    def _show_point(self) -> None:
        self.state.config.update(self.state.server_point)
        self.panels.controls.set_values(dict(self.state.server_point))
