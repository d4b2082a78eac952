"""SliderRow: a labelled QSlider over an explicit list of values, with the current value shown."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QWidget


class SliderRow(QWidget):
    sigValueChanged = Signal(object)  # the mapped value (not the slider position)

    def __init__(self, title: str, values: Sequence[float], default: float,
                 fmt: Callable[[float], str] = str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._values = tuple(values)
        self._fmt = fmt
        self._title = QLabel(title)
        self._title.setMinimumWidth(150)
        self._slider = QSlider(Qt.Orientation.Horizontal)
        self._slider.setRange(0, len(self._values) - 1)
        self._slider.setPageStep(max(1, len(self._values) // 10))
        self._value = QLabel()
        self._value.setMinimumWidth(70)
        self._value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._title)
        layout.addWidget(self._slider, 1)
        layout.addWidget(self._value)
        self._slider.valueChanged.connect(self._on_slider)
        self.set_value(default)

    @property
    def slider(self) -> QSlider:
        return self._slider

    def values(self) -> tuple[float, ...]:
        return self._values

    def value(self) -> float:
        return self._values[self._slider.value()]

    def value_text(self) -> str:
        return self._value.text()

    def set_value(self, value: float) -> None:
        """Move to the nearest available value without emitting sigValueChanged."""
        index = min(range(len(self._values)), key=lambda i: abs(self._values[i] - value))
        blocked = self._slider.blockSignals(True)
        self._slider.setValue(index)
        self._slider.blockSignals(blocked)
        self._value.setText(self._fmt(self._values[index]))

    def set_available(self, available: bool, why: str = "") -> None:
        self.setEnabled(available)
        self.setToolTip(why)  # available: how it works (e.g. "by restart"); not: why not
        self._value.setText(self._fmt(self.value()) if available else "n/a")

    def _on_slider(self, index: int) -> None:
        self._value.setText(self._fmt(self._values[index]))
        self.sigValueChanged.emit(self._values[index])
