"""Steering as a knob of Compare and Replay: a recorded answer's strengths to change, or the panel's to apply.

For an answer that was steered, one box per vector holds its recorded
strength: set it to 0 and the replay runs without that vector, so the token
diff shows what the steering changed. Otherwise (Compare, or an answer
written without steering) a check box offers the Steering panel's current
vectors. Hidden when there is nothing to offer.
"""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QHBoxLayout, QLabel, QWidget

from engine import steering as steer

from app.state.steering_state import SPIN_LIMIT, SteeringState
from app.widgets.subscriptions import follow


class SteeringKnob(QWidget):
    def __init__(self, recorded: steer.Steering | None, panel: SteeringState | None, *, use_panel: bool = False,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self._recorded = recorded
        self._panel = panel
        self.boxes: list[QDoubleSpinBox] = []
        self.use_panel = QCheckBox()
        self.use_panel.setChecked(use_panel)
        self.use_panel.setAccessibleName("Steer with the Steering panel's vectors")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        if recorded is not None:
            lay.addWidget(QLabel("Steering"))
            for entry in recorded.entries:
                box = QDoubleSpinBox()
                box.setRange(-SPIN_LIMIT, SPIN_LIMIT)
                box.setDecimals(2)
                box.setSingleStep(0.1)
                box.setValue(entry.strength)
                box.setPrefix(f"{entry.vector.name} ×")
                box.setAccessibleName(f"Strength of {entry.vector.name}")
                box.setToolTip("The strength this answer was steered with; 0 runs without this vector, so the "
                               "diff shows what the steering changed")
                self.boxes.append(box)
                lay.addWidget(box)
            self.use_panel.hide()
        else:
            lay.addWidget(self.use_panel)
            if panel is not None:  # the panel's state outlives this window
                follow(self, ((panel.changed, self._on_panel_changed),))
        lay.addStretch(1)
        self._on_panel_changed()

    def _on_panel_changed(self) -> None:
        if self._recorded is not None:
            return
        now = self._panel.steering() if self._panel is not None else None
        self.use_panel.setText(f"Steer with {now.describe()} (the Steering panel)" if now else "")
        self.setVisible(now is not None)

    def steering(self) -> steer.Steering | None:
        """What to run with: the recorded vectors at the boxes' strengths, or the panel's when ticked; None: none."""
        if self._recorded is not None:
            entries = tuple(steer.SteeringEntry(e.vector, box.value())
                            for e, box in zip(self._recorded.entries, self.boxes))
            chosen = steer.Steering(entries, self._recorded.layer_start, self._recorded.layer_end)
            return chosen if chosen.active else None
        if self.use_panel.isChecked() and self._panel is not None:
            return self._panel.steering()
        return None
