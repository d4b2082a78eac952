"""QuantErrorPanel: how far each weight matrix moved when it was quantized, as a per-layer heatmap.

The numbers are the engine's: LLMEngine.set_quantization returns {module name: ||W - Ŵ|| / ||W||},
the app hands that report to `set_report`; nothing here is estimated. The grid itself (layers x
projections, embedding and head rows, colour bar, tooltips) is widgets/quant_heatmap.py. With bf16 weights
the report is empty and the panel says that nothing is quantized.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine.quant_formats import DENSE
from widgets.panel_base import Panel
from widgets.quant_heatmap import HeatmapView, grid_of, pct

OFF_TEXT = "bf16 weights: nothing is quantized.\nDrag 'weights' to a quantized format to see each layer's error."


class QuantErrorPanel(Panel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._format: str | None = None  # the weights' format (engine/quant_formats.py)
        self._errors: dict[str, float] = {}
        self._title = QLabel()
        self._title.setTextFormat(Qt.TextFormat.RichText)
        self._title.setWordWrap(True)  # a long worst-layer name wraps instead of widening the dock
        self.view = HeatmapView()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.addWidget(self._title)
        layout.addWidget(self.view, 1)
        self.reset()

    # --- setters ------------------------------------------------------------------------------
    def set_report(self, fmt: str, errors: dict[str, float]) -> None:
        """The engine's report after a requantization to `fmt`: {module name: relative weight error}."""
        self._format = str(fmt)
        self._errors = {str(k): float(v) for k, v in errors.items()}
        self._mark_dirty()

    def reset(self) -> None:
        self._format = None
        self._errors = {}
        self._mark_dirty()
        self.flush()

    def snapshot_data(self) -> dict:
        errors = self._errors
        worst = max(errors, key=lambda name: errors[name]) if errors else None
        grid = grid_of(errors)
        return {"quant_format": self._format, "off": not errors, "num_cells": len(errors),
                "num_layers": len(grid.layers),
                "columns": [k.removesuffix("_proj") for k in grid.columns], "extra_rows": grid.top + grid.bottom,
                "mean_error": sum(errors.values()) / len(errors) if errors else None,
                "max_error": errors[worst] if worst else None, "worst": worst, "overlay": self.overlay_text()}

    # --- painting -----------------------------------------------------------------------------
    def _off_text(self) -> str:
        if self._errors:
            return ""
        if self._format in (None, DENSE):
            return OFF_TEXT
        return f"{self._format} weights: the engine reported no per-layer errors."

    def _repaint(self) -> None:
        self._update_overlay()
        self.view.set_errors(self._errors)
        self._title.setText(self._title_text())

    def _title_text(self) -> str:
        s = self.snapshot_data()
        if not self._errors:
            return "<b>Quantization error</b>: " + ("bf16 weights" if self._format in (None, DENSE) else "no report")
        return (f"<b>{self._format} weights</b>: relative weight error ‖W−Ŵ‖/‖W‖ per layer · mean "
                f"<b>{pct(s['mean_error'])}</b> · worst <b>{s['worst']}</b> {pct(s['max_error'])}")
