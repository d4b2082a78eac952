"""The tradeoff panel's two requests: apply a clicked point to the live engine (through the
controller's own configuration verb, as if the sliders had moved) and export the plot (CSV + PNG)."""
from __future__ import annotations

from pathlib import Path


def connect_tradeoff(controller) -> None:
    panel = controller.panels.tradeoff
    panel.sigApply.connect(lambda config: apply_config(controller, config))
    panel.sigExport.connect(lambda: export_dialog(controller))


def apply_config(controller, config: dict) -> None:
    if not controller.engine_ready:
        controller.window.show_message("the model is still loading")
        return
    controller.panels.controls.set_values(config)  # the sliders show it, without emitting
    controller._on_config_changed(dict(config))
    controller.window.show_message("applied from the tradeoff plot: " + ", ".join(
        f"{k} {v}" for k, v in config.items()))


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
