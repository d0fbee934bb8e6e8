"""One numeric sampler parameter: label, slider, spin box; ranges make invalid values impossible to type."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QHBoxLayout, QLabel, QSlider, QSpinBox, QWidget

SLIDER_MIN_WIDTH = 40  # px: below this a slider cannot be dragged with any precision


@dataclass(frozen=True)
class ParamSpec:
    name: str  # the SamplerSettings field (or "max_new_tokens")
    label: str
    tip: str
    minimum: float
    maximum: float
    step: float
    decimals: int = 2  # 0: an integer spin box
    slider_max: float | None = None  # the slider covers [minimum, slider_max]; the spin box goes further
    special: str = ""  # shown instead of the minimum value ("off", "greedy")


class ParamRow(QWidget):
    """Slider and spin box kept in step; `edited(name, value)` when the user changes either."""

    edited = Signal(str, object)

    def __init__(self, spec: ParamSpec, parent: QWidget | None = None):
        super().__init__(parent)
        self.spec = spec
        self.label = QLabel(spec.label)
        self.label.setToolTip(spec.tip)
        self.label.setMinimumWidth(self.label.sizeHint().width())
        self.spin: QSpinBox | QDoubleSpinBox
        if spec.decimals == 0:
            self.spin = QSpinBox()
            self.spin.setRange(int(spec.minimum), int(spec.maximum))
            self.spin.setSingleStep(max(1, int(spec.step)))
        else:
            self.spin = QDoubleSpinBox()
            self.spin.setDecimals(spec.decimals)
            self.spin.setRange(spec.minimum, spec.maximum)
            self.spin.setSingleStep(spec.step)
        if spec.special:
            self.spin.setSpecialValueText(spec.special)
        # Emit on Enter / focus out / arrows, not on every keystroke of "0.95".
        self.spin.setKeyboardTracking(False)
        self.spin.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
        self.spin.setAlignment(Qt.AlignmentFlag.AlignRight)
        # Wide enough for the longest value or its special text ("0 (greedy)"): never clipped.
        self.spin.setMinimumWidth(self.spin.sizeHint().width())
        self.spin.setAccessibleName(spec.label)
        self.spin.setToolTip(spec.tip)

        top = spec.slider_max if spec.slider_max is not None else spec.maximum
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, round((top - spec.minimum) / spec.step))
        self.slider.setAccessibleName(f"{spec.label} slider")
        self.slider.setToolTip(spec.tip)
        self.slider.setMinimumWidth(SLIDER_MIN_WIDTH)  # counted in the panel's minimum, so a narrow dock never squeezes it

        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label)
        row.addWidget(self.slider, 1)
        row.addWidget(self.spin)
        self.label.setBuddy(self.spin)

        self.slider.valueChanged.connect(self._on_slider)
        self.spin.valueChanged.connect(self._on_spin)

    def value(self) -> float | int:
        return self.spin.value()

    def set_value(self, value: float | int) -> None:
        """Show `value` without emitting `edited` (the state changed elsewhere)."""
        for w in (self.spin, self.slider):
            w.blockSignals(True)
        if isinstance(self.spin, QSpinBox):  # an integer parameter (decimals 0): its values are whole already
            self.spin.setValue(round(value))
        else:
            self.spin.setValue(value)
        self.slider.setValue(self._to_slider(self.spin.value()))
        for w in (self.spin, self.slider):
            w.blockSignals(False)

    def _to_slider(self, value: float) -> int:
        return max(self.slider.minimum(), min(self.slider.maximum(), round((value - self.spec.minimum) / self.spec.step)))

    def _on_slider(self, position: int) -> None:
        value = self.spec.minimum + position * self.spec.step
        self.spin.blockSignals(True)
        if isinstance(self.spin, QSpinBox):  # decimals 0
            self.spin.setValue(round(value))
        else:
            self.spin.setValue(round(value, self.spec.decimals))
        self.spin.blockSignals(False)
        self.edited.emit(self.spec.name, self.spin.value())

    def _on_spin(self, value: float | int) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(self._to_slider(value))
        self.slider.blockSignals(False)
        self.edited.emit(self.spec.name, value)
