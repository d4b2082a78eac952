"""SliderRow: a labelled QSlider over an explicit list of values (numbers, or names such as weight formats),
with the current value shown."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QWidget


class SliderRow(QWidget):
    sigValueChanged = Signal(object)  # the mapped value (not the slider position)

    def __init__(self, title: str, values: Sequence[Any], default: Any,
                 fmt: Callable[[Any], str] = str, parent: QWidget | None = None, help_text: str = "") -> None:
        super().__init__(parent)
        self._values = tuple(values)
        self._fmt = fmt
        self._help = help_text  # the tooltip while it works (the knob's help)
        self.setToolTip(help_text)
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

    def values(self) -> tuple[Any, ...]:
        return self._values

    def value(self) -> Any:
        return self._values[self._slider.value()]

    def value_text(self) -> str:
        return self._value.text()

    def set_value(self, value: Any) -> None:
        """Move to the nearest available value (a name: that name; one not among the values: stay) without
        emitting sigValueChanged."""
        if all(isinstance(v, (int, float)) for v in self._values) and isinstance(value, (int, float)):
            index = min(range(len(self._values)), key=lambda i: abs(self._values[i] - value))
        elif value in self._values:
            index = self._values.index(value)
        else:
            return
        blocked = self._slider.blockSignals(True)
        self._slider.setValue(index)
        self._slider.blockSignals(blocked)
        self._value.setText(self._fmt(self._values[index]))

    def set_available(self, available: bool, why: str = "") -> None:
        self.setEnabled(available)
        self.setToolTip(why or self._help)  # available: how it works (e.g. "by restart"); not: why not
        self._value.setText(self._fmt(self.value()) if available else "n/a")

    def _on_slider(self, index: int) -> None:
        self._value.setText(self._fmt(self._values[index]))
        self.sigValueChanged.emit(self._values[index])
