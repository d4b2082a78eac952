"""AppController: what the user's clicks, keys and presets mean for the engine host and the panels.

Every command goes to the engine thread through EngineHost (queued, thread-safe); nothing here waits
for the engine. The controller keeps the configuration the user asked for, so it can label tradeoff
points, mark configuration changes on the timeline and restore a preset.
"""
from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox

from app import presets
from app.preset_actions import SCHEDULING_KEYS, PresetActions
from app.sweep import Sweep, SweepSpec
from app.tradeoff_actions import connect_tradeoff
from engine.sampling_params import SamplingParams

FEATURE_CONTROLS = {  # control -> (capability, why it is greyed out)
    "quant_bits": ("quantization", "Weight bits: arrives with weight quantization (issue 5)"),
    "num_speculative_tokens": ("speculative", "Draft length: arrives with speculative decoding (issue 4)"),
}
SPEC_OFF = "Speculative decoding: not available in this engine\n(arrives with issue 4)"
USER_MAX_TOKENS = 128
_LABELS = {"max_num_seqs": "max batch", "max_num_batched_tokens": "token budget",
           "enable_chunked_prefill": "chunked prefill", "policy": "policy", "arrival_rate": "arrivals",
           "compile": "torch.compile"}


class AppController(PresetActions, QObject):
    def __init__(self, window, host, panels: dict, feeder, meter, caption) -> None:
        super().__init__(window)
        self.window, self.host, self.panels = window, host, panels
        self.feeder, self.meter, self.caption = feeder, meter, caption
        self.preset: presets.Preset | None = None
        self.presets_dir = presets.PRESETS_DIR
        self.capabilities: frozenset[str] = frozenset()
        self.start_kv_blocks = host.config.num_kv_blocks  # presets without num_kv_blocks go back to it
        self.spec_method: str | None = None
        self.engine_bits = 16  # what the engine's weights are now
        self._rebuilt_for_knob = False
        self.engine_busy = False  # requantizing / measuring in the engine thread
        self.config: dict = {"max_num_seqs": 64, "max_num_batched_tokens": 512, "enable_chunked_prefill": True,
                             "policy": "fcfs", "compile": False, "quant_bits": 16, "num_speculative_tokens": 0}
        self.arrival_rate = 2.0
        self.load_running = False
        self.sweeping = False
        self.engine_ready = False  # on_loaded ran: presets and controls reach the engine
        self.interactive = True  # False: errors go to the status bar only (screenshots, tests)
        self.last_error: str | None = None
        c = panels["controls"]
        c.setEnabled(False)
        c.sigConfigChanged.connect(self._on_config_changed)
        c.sigLoadChanged.connect(lambda d: self.set_arrival_rate(d["arrival_rate"]))
        c.sigBudgetChanged.connect(self._on_budget_changed)
        c.sigStartLoad.connect(lambda: self.set_load_running(True))
        c.sigStopLoad.connect(lambda: self.set_load_running(False))
        c.sigBurst.connect(self.burst)
        c.sigReset.connect(self.reset)
        panels["tokens"].sigSubmit.connect(self.submit)
        panels["tradeoff"].sigSweep.connect(self.run_sweep)
        connect_tradeoff(self)  # click a point: apply it to the live engine; export CSV / PNG
        feeder.sigSweepProgress.connect(self._on_sweep_progress)
        feeder.sigBusy.connect(self._on_busy)
        feeder.sigQuantized.connect(self._on_quantized)
        self._grey_out_features()

    # --- engine lifecycle ---------------------------------------------------------------------
    def on_loaded(self, info) -> None:
        self.capabilities = info.capabilities
        self.engine_ready = True
        self.engine_bits = info.config.get("quant_bits", 16)
        self.panels["tokens"].set_token_decoder(info.tokenizer.id_to_piece)
        self.feeder.tokenizer = info.tokenizer
        self.panels["controls"].setEnabled(True)
        self._grey_out_features()
        knob, self._rebuilt_for_knob = self._rebuilt_for_knob, False
        if knob:  # a slider rebuilt the engine: carry on with the same load
            self._push_config()
            self.set_load_running(self.load_running)
        elif self.preset is not None:  # again, now that the engine's features are known
            self.apply_preset(self.preset.path)
        else:
            self._push_config()

    def _on_quantized(self, bits: int) -> None:
        self.engine_bits = bits
        self.window.show_message(f"weights are now {bits}-bit")

    def on_load_failed(self, message: str) -> None:
        self.error(f"the model could not be loaded: {message}")

    def shutdown(self) -> None:
        self.host.cancel_sweep()

    def _grey_out_features(self) -> None:
        controls = self.panels["controls"]
        for name, (cap, why) in FEATURE_CONTROLS.items():
            controls.set_feature_available(name, cap in self.capabilities, "" if cap in self.capabilities else why)
        spec_on = "speculative" in self.capabilities
        self.panels["spec"].set_available(spec_on, "" if spec_on else SPEC_OFF)

    # --- presets: app/preset_actions.py --------------------------------------------------------
    def _push_config(self) -> None:
        knobs = {k: self.config[k] for k in SCHEDULING_KEYS}
        if self._spec_live():
            knobs.update(spec_method=self.spec_method, num_speculative_tokens=self.config["num_speculative_tokens"])
        self.host.reconfigure(**knobs)
        self.meter.set_config({**self.config, "arrival_rate": self.arrival_rate})

    def set_chunked_prefill(self, on: bool) -> None:
        self._on_config_changed({"enable_chunked_prefill": bool(on)})

    def set_compiled(self, on: bool) -> None:
        self._on_config_changed({"compile": bool(on)})
        if on and self.engine_ready:
            self.window.show_message("torch.compile on: the next steps compile the dense layers (tens of "
                                     "seconds on a CPU), then run the fused kernels")

    def _sync_actions(self) -> None:
        for name, key in (("chunked", "enable_chunked_prefill"), ("compile", "compile")):
            action = self.window.actions_by_name.get(name)
            if action is not None:
                action.setChecked(bool(self.config[key]))

    def _on_config_changed(self, values: dict) -> None:
        if self.engine_ready:
            self._on_feature_knobs(values)
        changes = {k: v for k, v in values.items() if k in SCHEDULING_KEYS and self.config.get(k) != v}
        if not changes:
            return
        if not self.engine_ready:  # loading: on_loaded sends the whole configuration
            self.config.update(changes)
            self._sync_actions()
            return
        try:
            self.host.reconfigure(**changes)
        except (ValueError, RuntimeError) as exc:
            self.error(str(exc))
            return
        text = ", ".join(f"{_LABELS[k]} {_show(self.config[k])} → {_show(v)}" for k, v in changes.items())
        self.config.update(changes)
        self._sync_actions()
        self.panels["timeline"].mark_config_change(text)
        self.meter.set_config({**self.config, "arrival_rate": self.arrival_rate})

    def _on_feature_knobs(self, values: dict) -> None:
        """Weight bits requantize in the engine thread; a new draft length rebuilds the engine."""
        bits = values.get("quant_bits", self.config["quant_bits"])
        if bits != self.config["quant_bits"] and "quantization" in self.capabilities:
            self.panels["timeline"].mark_config_change(f"weights {self.config['quant_bits']} → {bits}-bit")
            self.config["quant_bits"] = bits
            self.host.quantize(bits)
            self.meter.set_config({**self.config, "arrival_rate": self.arrival_rate})
        k = values.get("num_speculative_tokens", self.config["num_speculative_tokens"])
        before = self.config["num_speculative_tokens"]
        if k != before and "speculative" in self.capabilities:
            self.config["num_speculative_tokens"] = k
            self.spec_method = (self.spec_method or "ngram") if k else None
            if not self._spec_live():
                self._rebuild({"spec_method": self.spec_method, "num_speculative_tokens": k}, knob=True)
                return
            self.host.reconfigure(spec_method=self.spec_method, num_speculative_tokens=k)
            self.panels["timeline"].mark_config_change(f"draft length {before} → {k}")
            self.meter.set_config({**self.config, "arrival_rate": self.arrival_rate})

    def _on_budget_changed(self, ttft_s: float, tpot_s: float) -> None:
        self.panels["latency"].set_budget(ttft_s, tpot_s)

    def set_arrival_rate(self, rate: float) -> None:
        self.arrival_rate = rate
        self.host.set_arrival_rate(rate)
        self.meter.set_config({**self.config, "arrival_rate": rate})

    def set_load_running(self, running: bool) -> None:
        self.load_running = running
        (self.host.start_load if running else self.host.stop_load)()
        self.panels["controls"].set_load_running(running)
        self.window.show_message("load generator running" if running else "load generator stopped")

    def toggle_load(self) -> None:
        self.set_load_running(not self.load_running)

    def burst(self, n: int | None = None) -> None:
        n = n if n is not None else self.panels["controls"].snapshot_data()["values"]["burst_size"]
        self.host.burst(int(n))
        self.window.show_message(f"burst of {int(n)} long prompts")

    def reset(self) -> None:
        """Stop the load, abort every request, clear the panels (the engine's config stays)."""
        self.host.reset()
        self.load_running = False
        self.panels["controls"].set_load_running(False)
        self.window.show_message("reset: load stopped, requests aborted, panels cleared")

    def submit(self, prompt: str, chat: bool) -> None:
        info = self.host.info
        if info is None:
            self.window.show_message("the model is still loading")
            return
        text = prompt
        if chat and info.tokenizer.has_chat_template:
            text = info.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        params = SamplingParams(max_tokens=USER_MAX_TOKENS, temperature=0.7, logprobs=5)
        try:
            rid = self.host.add_request(text, params)
        except Exception as exc:  # bad request (ValueError), still loading, or admission control
            self.error(f"request refused: {exc}")
            return
        title = prompt if len(prompt) <= 24 else prompt[:23] + "…"
        self.feeder.add_user_stream(rid, title, prompt + ("   [chat template]" if text != prompt else ""))

    # --- sweep --------------------------------------------------------------------------------
    def run_sweep(self, spec: SweepSpec | None = None) -> None:
        if not self.host.loaded:
            self.window.show_message("the model is still loading")
            return
        if self.sweeping:
            self.window.show_message("a sweep is already running")
            return
        self.sweeping = True
        self.meter.paused = True
        self.host.run_sweep(Sweep(spec or SweepSpec()))

    def _on_busy(self, text: str, fraction) -> None:
        self.engine_busy = bool(text)
        self.panels["controls"].set_busy(text or None, fraction)
        if text:
            self.window.show_message(text)

    def _on_sweep_progress(self, text: str, fraction: float) -> None:
        controls = self.panels["controls"]
        if text:
            controls.set_busy(text, fraction)
            self.window.show_message(text)
            return
        controls.set_busy(None)
        self.sweeping = False
        self.meter.paused = False
        self.meter.restart()
        self.window.show_message("sweep done: its points are on the tradeoff plot")

    # --- messages -----------------------------------------------------------------------------
    def error(self, message: str, title: str = "inferlab") -> None:
        self.last_error = message
        self.window.show_message(message)
        if self.interactive:
            box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self.window)
            box.setModal(False)
            box.open()


def _show(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)
