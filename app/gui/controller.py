"""AppController: what the user's clicks, keys and presets mean for the engine source and the panels.

Every command goes to the engine source (app/source/engine_source.py; today EngineHost, which queues it for the
engine thread); nothing here waits for the engine. What the source cannot do is read from its declared
capabilities (EngineInfo.capabilities) and said on screen. The controller keeps the configuration the
user asked for, so it can label tradeoff points, mark configuration changes on the timeline and restore
a preset; it starts from the knobs' defaults (app/talk/knob_defaults.py: EngineConfig's own).
"""
from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox

from app.gui.availability import grey_out_features
from app.gui.control_state import ControlState
from app.gui.cue_player import CuePlayer
from app.gui.live_scale import LiveScale
from app.gui.panels import Panels
from app.gui.preset_actions import SCHEDULING_KEYS, PresetActions
from app.gui.server_restarts import ServerRestarts
from app.gui.tradeoff_actions import connect_tradeoff
from app.talk.knob_defaults import engine_knob_defaults, knob_defaults, kv_cache_dtype
from app.tradeoff.sweep import Sweep, SweepSpec
from engine.events import SpecMethod
from engine.sampling_params import SamplingParams

USER_MAX_TOKENS = 128
_LABELS = {"max_num_seqs": "max batch", "max_num_batched_tokens": "token budget",
           "enable_chunked_prefill": "chunked prefill", "policy": "policy", "arrival_rate": "arrivals",
           "compile": "torch.compile"}


class AppController(QObject):
    def __init__(self, window, host, panels: Panels, feeder, meter, caption) -> None:
        super().__init__(window)
        self.window, self.host, self.panels = window, host, panels
        self.feeder, self.meter, self.caption = feeder, meter, caption
        self.state = ControlState(config=engine_knob_defaults(), arrival_rate=knob_defaults()["arrival_rate"],
                                  source_name=host.name, start_kv_blocks=host.config.num_kv_blocks)
        defaults = knob_defaults()
        self.state.budget_s = (defaults["ttft_budget_s"], defaults["tpot_budget_s"])  # until a preset or slider
        self.engine_busy = False  # requantizing / measuring in the engine thread
        self.load_running = False
        self.sweeping = False
        self.interactive = True  # False: errors go to the status bar only (screenshots, tests)
        self.last_error: str | None = None
        self.cues = CuePlayer(self)  # the preset's scripted moments (bursts, knobs), N plays the next
        self.live_scale = LiveScale(self)  # a preset's live rate within what the engine serves now
        feeder.step_listeners.append(self.live_scale.add_step)
        self.presets = PresetActions(window, host, panels, caption, self.cues, self.state, self)
        self.restarts = ServerRestarts(window, host, panels, self.state, self)  # a managed server's sliders
        c = panels.controls
        c.setEnabled(False)
        c.sigConfigChanged.connect(self._on_config_changed)
        c.sigLoadChanged.connect(self.set_load)
        c.sigBudgetChanged.connect(self._on_budget_changed)
        c.sigServeBudget.connect(self._on_serve_budget)
        c.sigStartLoad.connect(lambda: self.set_load_running(True))
        c.sigStopLoad.connect(lambda: self.set_load_running(False))
        c.sigBurst.connect(self.burst)
        c.sigReset.connect(self.reset)
        panels.tokens.sigSubmit.connect(self.submit)
        panels.lora.sigAskAll.connect(self.ask_every_adapter)
        panels.tradeoff.sigSweep.connect(self.run_sweep)
        connect_tradeoff(self)  # click a point: apply it to the live engine; export CSV / PNG
        feeder.sigSweepProgress.connect(self._on_sweep_progress)
        feeder.sigBusy.connect(self._on_busy)
        feeder.sigComparison.connect(self.presets.on_comparison)
        panels.comparison.sigRerunRequested.connect(self.presets.measure_comparison)
        feeder.sigQuantized.connect(self._on_quantized)
        feeder.sigServerRestarted.connect(self.restarts.on_restarted)
        self._grey_out_features()

    # --- engine lifecycle ---------------------------------------------------------------------
    def on_loaded(self, info) -> None:
        self.state.capabilities = info.capabilities
        self.state.source_name = info.source
        self.state.engine_ready = True
        self.state.engine_bits = info.config.get("quant_bits", 16)
        self.panels.controls.setEnabled(True)
        self._grey_out_features()
        self.restarts.on_loaded(info)
        knob, self.state.rebuilt_for_knob = self.state.rebuilt_for_knob, False
        if knob:  # a slider rebuilt the engine: carry on with the same load
            self.push_config()
            self.set_load_running(self.load_running)
        elif self.state.preset is not None:  # again, now that the engine's features are known
            self.presets.apply_preset(self.state.preset.path)
        else:
            self.push_config()

    def _on_quantized(self, bits: int, _num_kv_blocks: int) -> None:
        self.state.engine_bits = bits
        self.window.show_message(f"weights are now {bits}-bit")

    def on_load_failed(self, message: str) -> None:
        self.error(f"the model could not be loaded: {message}")

    def shutdown(self) -> None:
        self.cues.stop()  # a closed window's cues must not keep driving its source
        self.host.cancel_measurement()

    def _grey_out_features(self) -> None:
        grey_out_features(self.panels, self.state.capabilities, self.state.source_name, self.state.engine_ready)

    # --- presets: app/gui/preset_actions.py --------------------------------------------------------
    # read-only views of the shared state and the presets' verbs, for the menus, launch and tests
    @property
    def preset(self):
        return self.state.preset

    @property
    def presets_dir(self):
        return self.state.presets_dir

    @property
    def engine_ready(self) -> bool:
        return self.state.engine_ready

    @property
    def config(self) -> dict:
        return self.state.config

    @property
    def measuring(self) -> bool:
        return self.state.measuring

    def apply_preset(self, name_or_path) -> bool:
        return self.presets.apply_preset(name_or_path)

    def step_preset(self, delta: int) -> None:
        self.presets.step_preset(delta)

    def measure_comparison(self, every_preset: bool = False) -> None:
        self.presets.measure_comparison(every_preset)

    def push_config(self) -> None:
        knobs = {k: self.state.config[k] for k in SCHEDULING_KEYS if k in self.state.capabilities.reconfigurable}
        if self.presets.spec_live():
            knobs.update(spec_method=self.state.spec_method,
                         num_speculative_tokens=self.state.config["num_speculative_tokens"])
        if "ttft_budget_ms" in self.state.capabilities.reconfigurable:
            knobs.update(self._budget_knobs())
        self.host.reconfigure(**knobs)
        self.meter.set_config({**self.state.config, "arrival_rate": self.state.arrival_rate})

    def _budget_knobs(self) -> dict:
        """The engine's latency-budget knobs: the sliders' budget while the scheduler serves toward it."""
        if not self.state.serve_budget or self.state.budget_s is None:
            return {"ttft_budget_ms": None, "tpot_budget_ms": None}
        ttft_s, tpot_s = self.state.budget_s
        return {"ttft_budget_ms": ttft_s * 1000, "tpot_budget_ms": tpot_s * 1000}

    def _on_serve_budget(self, on: bool) -> None:
        self.state.serve_budget = on
        if not self.state.engine_ready:
            return
        try:
            self.host.reconfigure(**self._budget_knobs())
        except (ValueError, RuntimeError) as exc:  # a source that cannot (greyed out), a bad value
            self.state.serve_budget = False
            self.panels.controls.set_values({"serve_budget": False})
            self.error(f"the scheduler cannot serve toward the budget: {exc}")
            return
        ttft_s, tpot_s = self.state.budget_s or (0.0, 0.0)
        self.panels.timeline.mark_config_change(
            f"scheduler serves the budget ({ttft_s * 1e3:.0f} / {tpot_s * 1e3:.0f} ms)" if on else "scheduler: plain")

    def set_chunked_prefill(self, on: bool) -> None:
        self._on_config_changed({"enable_chunked_prefill": bool(on)})

    def set_compiled(self, on: bool) -> None:
        self._on_config_changed({"compile": bool(on)})
        if on and self.state.engine_ready:
            self.window.show_message("torch.compile on: the next steps compile the dense layers (tens of "
                                     "seconds on a CPU), then run the fused kernels")

    def sync_actions(self) -> None:
        for name, key in (("chunked", "enable_chunked_prefill"), ("compile", "compile")):
            action = self.window.actions_by_name.get(name)
            if action is not None:
                action.setChecked(bool(self.state.config[key]))

    def _on_config_changed(self, values: dict) -> None:
        values = self.restarts.take(values)  # a managed server's batch / bits / draft: a restart
        if self.state.engine_ready:
            self._on_feature_knobs(values)
        changes = {k: v for k, v in values.items() if k in SCHEDULING_KEYS and self.state.config.get(k) != v}
        fixed = [k for k in changes if self.state.engine_ready and k not in self.state.capabilities.reconfigurable]
        if fixed:  # a preset's cue on an attached server: say so, change nothing there
            self.window.show_message(f"{', '.join(_LABELS[k] for k in fixed)}: set when {self.state.source_name} "
                                     "starts; not changeable from a client")
            changes = {k: v for k, v in changes.items() if k not in fixed}
        if not changes:
            return
        if not self.state.engine_ready:  # loading: on_loaded sends the whole configuration
            self.state.config.update(changes)
            self.sync_actions()
            return
        try:
            self.host.reconfigure(**changes)
        except (ValueError, RuntimeError) as exc:
            self.error(str(exc))
            return
        text = ", ".join(f"{_LABELS[k]} {_show(self.state.config[k])} → {_show(v)}" for k, v in changes.items())
        self.state.config.update(changes)
        self.sync_actions()
        self.panels.timeline.mark_config_change(text)
        self.meter.set_config({**self.state.config, "arrival_rate": self.state.arrival_rate})

    def _on_feature_knobs(self, values: dict) -> None:
        """Weight bits requantize in the engine thread; KV cache bits and a new draft length rebuild
        the engine (the KV cache is allocated with its dtype)."""
        kv_bits = values.get("kv_cache_bits", self.state.config["kv_cache_bits"])
        if kv_bits != self.state.config["kv_cache_bits"] and self.state.capabilities.rebuild:
            self.panels.timeline.mark_config_change(f"KV cache {self.state.config['kv_cache_bits']} → {kv_bits}-bit")
            self.state.config["kv_cache_bits"] = kv_bits
            self.presets.rebuild({"kv_cache_dtype": kv_cache_dtype(kv_bits)}, knob=True)
            return
        bits = values.get("quant_bits", self.state.config["quant_bits"])
        if bits != self.state.config["quant_bits"] and self.state.capabilities.quantization:
            self.panels.timeline.mark_config_change(f"weights {self.state.config['quant_bits']} → {bits}-bit")
            self.state.config["quant_bits"] = bits
            self.host.quantize(bits, values.get("quant_group_size"))  # a tradeoff point's own group size
            self.meter.set_config({**self.state.config, "arrival_rate": self.state.arrival_rate})
        k = values.get("num_speculative_tokens", self.state.config["num_speculative_tokens"])
        before = self.state.config["num_speculative_tokens"]
        if k != before and self.state.capabilities.speculative:
            self.state.config["num_speculative_tokens"] = k
            self.state.spec_method = (self.state.spec_method or SpecMethod.NGRAM) if k else None
            if not self.presets.spec_live():
                self.presets.rebuild({"spec_method": self.state.spec_method, "num_speculative_tokens": k}, knob=True)
                return
            self.host.reconfigure(spec_method=self.state.spec_method, num_speculative_tokens=k)
            self.panels.timeline.mark_config_change(f"draft length {before} → {k}")
            self.meter.set_config({**self.state.config, "arrival_rate": self.state.arrival_rate})

    def _on_budget_changed(self, ttft_s: float, tpot_s: float) -> None:
        self.panels.latency.set_budget(ttft_s, tpot_s)
        self.state.budget_s = (ttft_s, tpot_s)
        if self.state.serve_budget and self.state.engine_ready:
            self._on_serve_budget(True)  # the scheduler follows the new budget

    def set_load(self, values: dict) -> None:
        """The Load generator's sliders (LoadConfig fields by name): the arrival rate by its own verb (the
        Poisson clock keeps its phase), any other field in a new LoadConfig for the source."""
        self.set_arrival_rate(values["arrival_rate"])
        others = {k: v for k, v in values.items() if k != "arrival_rate"}
        if others:
            self.state.load_values.update(others)
            self.host.set_load_config(self.presets.load_config())

    def set_arrival_rate(self, rate: float) -> None:
        """The slider's or a cue's rate: theirs, not scaled (app/gui/live_scale.py) until the next preset."""
        self.live_scale.user_set()
        self._set_rate(rate)

    def scale_arrival_rate(self, rate: float, said: str) -> None:
        """The live scale's rate, shown on the slider and said in the status bar."""
        self._set_rate(rate)
        self.panels.controls.set_values({"arrival_rate": rate})
        self.window.show_message(said)

    def _set_rate(self, rate: float) -> None:
        self.state.arrival_rate = rate
        self.host.set_arrival_rate(rate)
        self.meter.set_config({**self.state.config, "arrival_rate": rate})

    def apply_knobs(self, knobs: dict) -> None:
        """Turn knobs as the sliders would (a preset's cue), and show the sliders where they now are."""
        self._on_config_changed(knobs)
        self.panels.controls.set_values({k: v for k, v in self.state.config.items() if k in knobs})

    def next_cue(self) -> None:
        self.cues.next_cue()

    def set_load_running(self, running: bool) -> None:
        if not running:
            self.cues.stop()
        elif self.state.preset is not None and self.state.preset.cues and not self.cues.running:
            self.cues.start(self.state.preset.cues, self.state.preset.cue_period_s)
        self.load_running = running
        (self.host.start_load if running else self.host.stop_load)()
        self.panels.controls.set_load_running(running)
        self.window.show_message("load generator running" if running else "load generator stopped")

    def toggle_load(self) -> None:
        self.set_load_running(not self.load_running)

    def burst(self, n: int | None = None) -> None:
        n = n if n is not None else self.panels.controls.snapshot_data()["values"]["burst_size"]
        self.host.burst(int(n))
        self.window.show_message(f"burst of {int(n)} long prompts")

    def ask_every_adapter(self, prompt: str) -> None:
        """One prompt to the base model and every LoRA adapter at once; the LoRA panel shows the answers."""
        if self.host.info is None or not self.state.capabilities.lora:
            self.window.show_message("the model is still loading" if self.host.info is None
                                     else f"multi-LoRA serving is not offered by {self.state.source_name}")
            return
        self.host.ask_every_adapter(prompt, chat=bool(self.host.info.has_chat_template))
        self.window.docks["lora"].show()
        self.window.docks["lora"].raise_()
        self.window.show_message(f"asked every adapter: {prompt!r}")

    def reset(self) -> None:
        """Stop the load, abort every request, clear the panels (the engine's config stays)."""
        self.host.reset()
        self.cues.stop()
        self.load_running = False
        self.panels.controls.set_load_running(False)
        self.window.show_message("reset: load stopped, requests aborted, panels cleared")

    def submit(self, prompt: str, chat: bool) -> None:
        if self.host.info is None:
            self.window.show_message("the model is still loading")
            return
        params = SamplingParams(max_tokens=USER_MAX_TOKENS, temperature=0.7, logprobs=5)
        try:
            rid, templated = self.host.submit_prompt(prompt, params, chat)
        except Exception as exc:  # bad request (ValueError), still loading, or admission control
            self.error(f"request refused: {exc}")
            return
        title = prompt if len(prompt) <= 24 else prompt[:23] + "…"
        self.feeder.add_user_stream(rid, title, prompt + ("   [chat template]" if templated else ""))

    # --- sweep --------------------------------------------------------------------------------
    def run_sweep(self, spec: SweepSpec | None = None) -> None:
        if self.state.engine_ready and not self.state.capabilities.sweep:
            self.window.show_message("the tradeoff sweep runs the embedded engine; not offered by "
                                     f"{self.state.source_name}")
            return
        if not self.host.loaded:
            self.window.show_message("the model is still loading")
            return
        if self.sweeping:
            self.window.show_message("a sweep is already running")
            return
        self.sweeping = True
        self.meter.paused = True
        self.host.run_measurement(Sweep(spec or SweepSpec()))

    def _on_busy(self, text: str, fraction) -> None:
        self.engine_busy = bool(text)
        if not text:
            self.state.measuring = False
        self.panels.controls.set_busy(text or None, fraction)
        if text:
            self.window.show_message(text)

    def _on_sweep_progress(self, text: str, fraction: float) -> None:
        controls = self.panels.controls
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
