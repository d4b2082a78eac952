"""The tradeoff panel's requests: apply a clicked point to the live engine (through the controller's
own configuration verb, as if the sliders had moved, reusing the sweep's measured perplexities so that
nothing is scored again), copy a point as its `inferlab serve` command, export the plot (CSV + PNG)."""
from __future__ import annotations

from pathlib import Path

from app.knob_args import serve_command
from app.tradeoff.point_quality import reusable_perplexity


def connect_tradeoff(controller) -> None:
    panel = controller.panels.tradeoff
    panel.sigApply.connect(lambda config: apply_config(controller, config))
    panel.sigExport.connect(lambda: export_dialog(controller))
    panel.sigCopyCommand.connect(lambda config: copy_command(controller, config))
    panel.sigSweepLoad.connect(lambda batch: run_sweep_load(controller, batch))
    # a slider moved: the ring leaves the applied sweep point and follows the live configuration again
    controller.panels.controls.sigConfigChanged.connect(lambda _changes: panel.set_applied(None))


def run_sweep_load(controller, batch: int) -> None:
    """The live load as the sweep measured its points: `batch` requests always in flight (closed-loop users
    who ask again at once), its prompt and answer lengths; the arrival-rate slider takes it back."""
    from app.tradeoff.sweep_point import Workload

    wl = Workload()
    controller.set_load({"arrival_rate": 0.0, "num_users": batch, "think_time_s": 0.0,
                         "prompt_tokens": wl.prompt_tokens, "output_tokens": wl.output_tokens})
    controller.set_load_running(True)
    controller.window.show_message(f"the sweep's load: {batch} requests always in flight, prompts of "
                                   f"{wl.prompt_tokens[0]}-{wl.prompt_tokens[1]} tokens, answers of "
                                   f"{wl.output_tokens[0]}-{wl.output_tokens[1]}")


def apply_config(controller, config: dict) -> None:
    if not controller.engine_ready:
        controller.window.show_message("the model is still loading")
        return
    if controller.state.capabilities.quantization:  # (an attached server cannot requantize)
        known = reusable_perplexity(controller.panels.tradeoff.sweep_points(), config,
                                    controller.state.config["quant_bits"])
        if known:  # posted before the requantization: the engine thread takes them first
            controller.host.adopt_perplexity(known)
    controller.panels.controls.set_values(config)  # the sliders show it, without emitting
    controller._on_config_changed(dict(config))
    controller.window.show_message("applied from the tradeoff plot: " + ", ".join(
        f"{k} {v}" for k, v in config.items()))


def copy_command(controller, config: dict) -> str:
    """Put the point's `inferlab serve` line on the clipboard (and say it in the status bar)."""
    from PySide6.QtGui import QGuiApplication

    info = controller.host.info
    if info is None:
        controller.window.show_message("the model is still loading")
        return ""
    line = serve_command(config, info.model)
    QGuiApplication.clipboard().setText(line)
    controller.window.show_message("copied: " + line)
    return line


def export_files(panel, base: str | Path) -> tuple[Path, Path]:
    base = Path(base).with_suffix("")
    csv_path, png_path = base.with_suffix(".csv"), base.with_suffix(".png")
    panel.export_csv(str(csv_path))
    panel.export_png(str(png_path))
    return csv_path, png_path


def export_dialog(controller) -> None:
    from PySide6.QtWidgets import QFileDialog

    path, _ = QFileDialog.getSaveFileName(controller.window, "Export the tradeoff plot (CSV and PNG)",
                                          "tradeoff.csv", "CSV (*.csv)")
    if path:
        csv_path, png_path = export_files(controller.panels.tradeoff, path)
        controller.window.show_message(f"exported {csv_path} and {png_path}")
