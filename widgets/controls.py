"""ControlsPanel: the knobs. Emits what the user asked for; the app decides what happens.

Slider drags are debounced (DEBOUNCE_MS after the last move) so a drag across 200 positions becomes
one reconfigure, not 200. `set_values` loads a preset silently and cancels pending emissions.
The starting values and the engine knobs' stops are data from the app (`defaults`, `stops`: the engine's
knob table and the like, app/talk/knob_defaults.py); the panel does not know them itself. `reset()` goes
back to the defaults.
"""
from __future__ import annotations

from collections.abc import Mapping

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

from widgets.slider_row import SliderRow

DEBOUNCE_MS = 300
CONFIG_KEYS = ("max_num_seqs", "quant_bits", "kv_cache_bits", "num_speculative_tokens", "max_num_batched_tokens")
# the Load generator box's sliders, each a LoadConfig field by name (app/load/generator.py): the app puts every
# value sigLoadChanged carries into the load generator's config, so a slider for what each generated request
# samples with (a SamplingParams field LoadConfig has) is a row in _STOPS and its name here
LOAD_KEYS = ("arrival_rate",)
TOKEN_BUDGETS = (*range(16, 257, 16), *range(320, 1025, 64), *range(1280, 4097, 256))
_STOPS = {  # key -> (title, slider stops unless given, format); a row starts on its first stop unless given a default
    "max_num_seqs": ("max batch size", range(1, 257), str),
    "quant_bits": ("weight bits", (16, 8, 4), lambda v: f"{v}-bit"),
    "kv_cache_bits": ("KV cache bits", (16, 8), lambda v: "16-bit" if v == 16 else "int8 + row scales"),
    "num_speculative_tokens": ("draft length", range(0, 9), lambda v: "off" if v == 0 else f"{v} tokens"),
    "max_num_batched_tokens": ("token budget / chunk", TOKEN_BUDGETS, lambda v: f"{v} tok"),
    "arrival_rate": ("arrival rate", [i / 10 for i in range(201)], lambda v: f"{v:.1f} req/s"),
    "ttft_budget_s": ("TTFT budget", [i / 1000 for i in range(50, 5001, 50)], lambda v: f"{v * 1e3:.0f} ms"),
    "tpot_budget_s": ("TPOT budget", [i / 1000 for i in range(5, 501, 5)], lambda v: f"{v * 1e3:.0f} ms"),
}


def _rows(defaults: Mapping, given_stops: Mapping) -> dict[str, SliderRow]:
    rows = {}
    for key, (title, stops, fmt) in _STOPS.items():
        stops = tuple(given_stops.get(key, stops))
        rows[key] = SliderRow(title, stops, defaults.get(key, stops[0]), fmt)
    return rows


def _debouncer(parent: QWidget, slot) -> QTimer:
    timer = QTimer(parent)
    timer.setSingleShot(True)
    timer.setInterval(DEBOUNCE_MS)
    timer.timeout.connect(slot)
    return timer


class ControlsPanel(QWidget):
    sigConfigChanged = Signal(dict)  # the CONFIG_KEYS
    sigLoadChanged = Signal(dict)  # the LOAD_KEYS: {"arrival_rate": req/s, ...}
    sigBudgetChanged = Signal(float, float)  # (ttft_s, tpot_s)
    sigServeBudget = Signal(bool)  # the scheduler serves toward the budget (on) or ignores it (off)
    sigStartLoad = Signal()
    sigStopLoad = Signal()
    sigBurst = Signal(int)  # number of long prompts
    sigReset = Signal()

    def __init__(self, parent: QWidget | None = None, defaults: Mapping | None = None,
                 stops: Mapping | None = None) -> None:
        """defaults: the values to start from and reset to (CONFIG_KEYS, LOAD_KEYS, "burst_size",
        "ttft_budget_s", "tpot_budget_s"); a missing one starts on its slider's first stop. stops: a key's
        slider stops, where the app's knob table gives them (else the panel's own)."""
        super().__init__(parent)
        self._defaults = dict(defaults or {})
        self._rows = _rows(self._defaults, stops or {})
        self._config_timer = _debouncer(self, self._on_config_timeout)
        self._load_timer = _debouncer(self, self._on_load_timeout)
        self._budget_timer = _debouncer(self, self._on_budget_timeout)
        timers = {**dict.fromkeys(CONFIG_KEYS, self._config_timer), **dict.fromkeys(LOAD_KEYS, self._load_timer),
                  "ttft_budget_s": self._budget_timer, "tpot_budget_s": self._budget_timer}
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
        self._busy_bar = QProgressBar()
        self._busy_bar.setMaximumWidth(220)
        self._feature_why: dict[str, str] = {}
        self._build_layout()
        self.reset()

    def _build_layout(self) -> None:
        engine = QGroupBox("Engine")
        el = QVBoxLayout(engine)
        for key in CONFIG_KEYS:
            el.addWidget(self._rows[key])
        load = QGroupBox("Load generator")
        ll = QVBoxLayout(load)
        for key in LOAD_KEYS:
            ll.addWidget(self._rows[key])
        buttons = QHBoxLayout()
        for w in (self._load_button, self._burst_button, self._burst_size):
            buttons.addWidget(w)
        ll.addLayout(buttons)
        budget = QGroupBox("Latency budget")
        bl = QVBoxLayout(budget)
        bl.addWidget(self._rows["ttft_budget_s"])
        bl.addWidget(self._rows["tpot_budget_s"])
        bl.addWidget(self._serve_budget)
        bottom = QHBoxLayout()
        bottom.addWidget(self._reset_button)
        bottom.addStretch(1)
        bottom.addWidget(self._busy_label)
        bottom.addWidget(self._busy_bar)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        for box in (engine, load, budget):
            layout.addWidget(box)
        layout.addLayout(bottom)
        layout.addStretch(1)

    # --- setters ------------------------------------------------------------------------------
    def set_values(self, values: dict) -> None:
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
        """Grey out one control with the reason as its tooltip: a CONFIG_KEYS or LOAD_KEYS name,
        "ttft_budget_s", "tpot_budget_s", "serve_budget", "load", "burst" or "reset"."""
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

    def config_values(self) -> dict:
        return {key: self._rows[key].value() for key in CONFIG_KEYS}

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
        self.sigLoadChanged.emit({key: self._rows[key].value() for key in LOAD_KEYS})

    def _on_budget_timeout(self) -> None:
        self.sigBudgetChanged.emit(self._rows["ttft_budget_s"].value(), self._rows["tpot_budget_s"].value())

    def _on_load_clicked(self, checked: bool) -> None:
        self._load_button.setText("Stop load" if checked else "Start load")
        (self.sigStartLoad if checked else self.sigStopLoad).emit()

    def _on_burst(self) -> None:
        self.sigBurst.emit(self._burst_size.value())
