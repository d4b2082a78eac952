"""QuantErrorPanel: how far each weight matrix moved when it was quantized, as a per-layer heatmap.

The numbers are the engine's: LLMEngine.set_quantization returns {module name: ||W - Ŵ|| / ||W||},
the app hands that report to `set_report`; nothing here is estimated. The grid itself (layers x
projections, embedding and head rows, colour bar, tooltips) is widgets/quant_heatmap.py. At 16 bits
the report is empty and the panel says that nothing is quantized.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from widgets.panel_base import Panel
from widgets.quant_heatmap import HeatmapView, grid_of, pct

OFF_TEXT = "16-bit weights: nothing is quantized.\nDrag 'weight bits' to 8 or 4 to see each layer's error."


class QuantErrorPanel(Panel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._bits: int | None = None
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
    def set_report(self, bits: int, errors: dict[str, float]) -> None:
        """The engine's report after a requantization: {module name: relative weight error}."""
        self._bits = int(bits)
        self._errors = {str(k): float(v) for k, v in errors.items()}
        self._mark_dirty()

    def reset(self) -> None:
        self._bits = None
        self._errors = {}
        self._mark_dirty()
        self.flush()

    def snapshot_data(self) -> dict:
        errors = self._errors
        worst = max(errors, key=errors.get) if errors else None
        grid = grid_of(errors)
        return {"bits": self._bits, "off": not errors, "num_cells": len(errors), "num_layers": len(grid.layers),
                "columns": [k.removesuffix("_proj") for k in grid.columns], "extra_rows": grid.top + grid.bottom,
                "mean_error": sum(errors.values()) / len(errors) if errors else None,
                "max_error": errors[worst] if worst else None, "worst": worst, "overlay": self.overlay_text()}

    # --- painting -----------------------------------------------------------------------------
    def _off_text(self) -> str:
        if self._errors:
            return ""
        if self._bits in (None, 16):
            return OFF_TEXT
        return f"{self._bits}-bit weights: the engine reported no per-layer errors."

    def _repaint(self) -> None:
        self._update_overlay()
        self.view.set_errors(self._errors)
        self._title.setText(self._title_text())

    def _title_text(self) -> str:
        s = self.snapshot_data()
        if not self._errors:
            return "<b>Quantization error</b>: " + ("16-bit weights" if self._bits in (None, 16) else "no report")
        return (f"<b>{self._bits}-bit weights</b>: relative weight error ‖W−Ŵ‖/‖W‖ per layer · mean "
                f"<b>{pct(s['mean_error'])}</b> · worst <b>{s['worst']}</b> {pct(s['max_error'])}")
