"""ControlsPanel: the knobs. Emits what the user asked for; the app decides what happens.

Every slider is a row of the knob table (engine/knobs.py: label, help, unit, stops, the box it sits in): the
panel draws the table's Engine, Load generator and Latency budget rows in table order, each value shown by
its row (`Knob.text`). A new knob with a `slider` is a new slider here, with no line of this file changed.
Slider drags are debounced (DEBOUNCE_MS after the last move) so a drag across 200 positions becomes
one reconfigure, not 200. `set_values` loads a preset silently and cancels pending emissions.
The starting values are data from the app (`defaults`: app/talk/knob_defaults.py; else each row's default or
first stop). `reset()` goes back to the defaults.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.knobs import Box, Knob, KnobValues, slider_knobs
from widgets.slider_row import SliderRow

DEBOUNCE_MS = 300
# the sliders of each box, in the table's order; the Load generator's are LoadConfig fields or what each
# generated request samples with (app/load/generator.py), the app hands every value sigLoadChanged carries
# to the load generator's config
CONFIG_KEYS = tuple(k.name for k in slider_knobs(Box.ENGINE))
LOAD_KEYS = tuple(k.name for k in slider_knobs(Box.LOAD))
BUDGET_KEYS = tuple(k.name for k in slider_knobs(Box.BUDGET))  # (TTFT ms, TPOT ms)


def _start(row: Knob, defaults: Mapping[str, Any]) -> Any:
    value = defaults.get(row.name, row.default)
    return row.stops[0] if value is None else value


def _rows(defaults: Mapping[str, Any]) -> dict[str, SliderRow]:
    return {row.name: SliderRow(row.label, row.stops, _start(row, defaults), row.text, help_text=row.help)
            for box in Box for row in slider_knobs(box)}


def _debouncer(parent: QWidget, slot) -> QTimer:
    timer = QTimer(parent)
    timer.setSingleShot(True)
    timer.setInterval(DEBOUNCE_MS)
    timer.timeout.connect(slot)
    return timer


class ControlsPanel(QWidget):
    sigConfigChanged = Signal(dict)  # KnobValues of the CONFIG_KEYS
    sigLoadChanged = Signal(dict)  # KnobValues of the LOAD_KEYS: {"arrival_rate": req/s, ...}
    sigBudgetChanged = Signal(float, float)  # (TTFT ms, TPOT ms): the BUDGET_KEYS
    sigServeBudget = Signal(bool)  # the scheduler serves toward the budget (on) or ignores it (off)
    sigStartLoad = Signal()
    sigStopLoad = Signal()
    sigBurst = Signal(int)  # number of long prompts
    sigReset = Signal()

    def __init__(self, parent: QWidget | None = None, defaults: Mapping[str, Any] | None = None) -> None:
        """defaults: the values to start from and reset to (the sliders' knobs by name, "burst_size"); a
        missing one starts at its row's default (or first stop)."""
        super().__init__(parent)
        self._defaults = dict(defaults or {})
        self._rows = _rows(self._defaults)
        self._config_timer = _debouncer(self, self._on_config_timeout)
        self._load_timer = _debouncer(self, self._on_load_timeout)
        self._budget_timer = _debouncer(self, self._on_budget_timeout)
        timers = {**dict.fromkeys(CONFIG_KEYS, self._config_timer), **dict.fromkeys(LOAD_KEYS, self._load_timer),
                  **dict.fromkeys(BUDGET_KEYS, self._budget_timer)}
        for key, timer in timers.items():
            # (re)start: the signal fires once, DEBOUNCE_MS after the last move
            self._rows[key].sigValueChanged.connect(lambda _value, t=timer: t.start())

        self._load_button = QPushButton("Start load")
        self._load_button.setCheckable(True)
        self._load_button.clicked.connect(self._on_load_clicked)
        self._burst_size = QSpinBox()
        self._burst_size.setRange(1, 256)
        self._burst_size.setSuffix(" prompts")
        self._burst_button = QPushButton("Burst of long prompts")
        self._burst_button.clicked.connect(self._on_burst)
        self._serve_budget = QCheckBox("Scheduler serves toward it")
        self._serve_budget.setProperty("explains",
            "On: prompts that can still get their first token within the TTFT budget go first, shortest first, "
            "and prompt chunks are sized so answers already streaming keep the TPOT budget. Off: the scheduler "
            "ignores the budget (the latency panel still counts who met it). Compare goodput both ways.")
        self._serve_budget.setToolTip(self._serve_budget.property("explains"))
        self._serve_budget.toggled.connect(self.sigServeBudget)
        self._reset_button = QPushButton("Reset")
        self._reset_button.clicked.connect(self.sigReset)
        self._busy_label = QLabel()
        # its own line, wrapped: one line of a long text ("measuring perplexity of ... weights") beside the reset
        # button widened the panel past its dock and hid the sliders' values behind a horizontal scroll bar
        self._busy_label.setWordWrap(True)
        self._busy_bar = QProgressBar()
        self._busy_bar.setMaximumWidth(220)
        self._feature_why: dict[str, str] = {}
        self._build_layout()
        self.reset()

    def _box(self, box: Box) -> tuple[QGroupBox, QVBoxLayout]:
        group = QGroupBox(box.value)
        rows = QVBoxLayout(group)
        for row in slider_knobs(box):
            rows.addWidget(self._rows[row.name])
        return group, rows

    def _build_layout(self) -> None:
        engine, _ = self._box(Box.ENGINE)
        load, ll = self._box(Box.LOAD)
        buttons = QHBoxLayout()
        for w in (self._load_button, self._burst_button, self._burst_size):
            buttons.addWidget(w)
        ll.addLayout(buttons)
        budget, bl = self._box(Box.BUDGET)
        bl.addWidget(self._serve_budget)
        bottom = QHBoxLayout()
        bottom.addWidget(self._reset_button)
        bottom.addStretch(1)
        bottom.addWidget(self._busy_bar)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        for box in (engine, load, budget):
            layout.addWidget(box)
        layout.addLayout(bottom)
        layout.addWidget(self._busy_label)
        layout.addStretch(1)

    # --- setters ------------------------------------------------------------------------------
    def set_values(self, values: Mapping[str, Any]) -> None:
        """Show a preset's values without emitting anything (unknown keys are ignored)."""
        for key, value in values.items():
            if key in self._rows:
                self._rows[key].set_value(value)
            elif key == "burst_size":
                self._burst_size.setValue(int(value))
            elif key == "load_running":
                self.set_load_running(bool(value))
            elif key == "serve_budget":
                self._serve_budget.blockSignals(True)
                self._serve_budget.setChecked(bool(value))
                self._serve_budget.blockSignals(False)
        for timer in (self._config_timer, self._load_timer, self._budget_timer):
            timer.stop()

    def set_load_running(self, running: bool) -> None:
        self._load_button.setChecked(running)
        self._load_button.setText("Stop load" if running else "Start load")

    def set_busy(self, text: str | None, fraction: float | None = None) -> None:
        """Show progress of background work (requantize, reload); text None or "" hides it.
        fraction None: indeterminate."""
        busy = bool(text)
        self._busy_label.setVisible(busy)
        self._busy_bar.setVisible(busy)
        self._busy_label.setText(text or "")
        if fraction is None:
            self._busy_bar.setRange(0, 0)
        else:
            self._busy_bar.setRange(0, 1000)
            self._busy_bar.setValue(round(1000 * min(1.0, max(0.0, fraction))))

    def set_feature_available(self, name: str, available: bool, why: str = "") -> None:
        """Grey out one control with the reason as its tooltip: a slider's knob name (CONFIG_KEYS, LOAD_KEYS,
        BUDGET_KEYS), "serve_budget", "load", "burst" or "reset"."""
        buttons = {"load": (self._load_button,), "burst": (self._burst_button, self._burst_size),
                   "reset": (self._reset_button,), "serve_budget": (self._serve_budget,)}
        if name in self._rows:
            self._rows[name].set_available(available, why)
        elif name in buttons:
            for w in buttons[name]:
                w.setEnabled(available)
                w.setToolTip(w.property("explains") or "" if available else why)
        else:
            raise KeyError(f"unknown control {name!r}")
        if available:
            self._feature_why.pop(name, None)
        else:
            self._feature_why[name] = why

    def reset(self) -> None:
        self.set_values(self._defaults)
        self.set_load_running(False)
        self.set_busy(None)

    def row(self, name: str) -> SliderRow:
        return self._rows[name]

    def config_values(self) -> KnobValues:
        return KnobValues({key: self._rows[key].value() for key in CONFIG_KEYS})  # type: ignore[misc]

    def snapshot_data(self) -> dict:
        return {"values": {**{k: r.value() for k, r in self._rows.items()},
                           "burst_size": self._burst_size.value()},
                "load_running": self._load_button.isChecked(),
                "busy": self._busy_label.text() if self._busy_label.isVisibleTo(self) else None,
                "busy_fraction": (None if self._busy_bar.maximum() == 0 else self._busy_bar.value() / 1000),
                "unavailable": dict(self._feature_why)}

    # --- slots --------------------------------------------------------------------------------
    def _on_config_timeout(self) -> None:
        self.sigConfigChanged.emit(self.config_values())

    def _on_load_timeout(self) -> None:
        self.sigLoadChanged.emit(KnobValues({key: self._rows[key].value() for key in LOAD_KEYS}))  # type: ignore[misc]

    def _on_budget_timeout(self) -> None:
        ttft, tpot = (float(self._rows[key].value()) for key in BUDGET_KEYS)
        self.sigBudgetChanged.emit(ttft, tpot)

    def _on_load_clicked(self, checked: bool) -> None:
        self._load_button.setText("Stop load" if checked else "Start load")
        (self.sigStartLoad if checked else self.sigStopLoad).emit()

    def _on_burst(self) -> None:
        self.sigBurst.emit(self._burst_size.value())
