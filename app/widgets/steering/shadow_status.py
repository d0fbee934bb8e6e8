"""A line above an answer in the "Steering effect" colouring: why it is not coloured yet, and a way to stop.

The colouring of a long answer takes minutes on a CPU (app/controllers/steering_shadows.py):
meanwhile this line shows a determinate bar ("computing… 128/512 tokens")
and a Stop button that cancels the engine's work; a stopped or failed answer
says so and offers to compute again; an answer written without steering
says that there is nothing to colour. Hidden when the answer is coloured,
and outside that mode.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from app.state.conversation import Conversation, Message
from app.controllers.steering_shadows import ShadowState, SteeringShadows


class ShadowStatus(QWidget):
    """Shows `SteeringShadows.state` of one answer; Stop and Compute again act on its job."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Steering effect progress")
        self._shadows: SteeringShadows | None = None
        self._conv: Conversation | None = None
        self._message: Message | None = None
        self.state: ShadowState | None = None  # what is shown (tests read it)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # an error may quote anything
        self.label.setWordWrap(True)
        self.label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Steering effect: tokens computed")
        self.bar.setMaximumWidth(160)
        self.bar.setTextVisible(False)  # the label says the numbers
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop computing the steering effect")
        self.stop_button.setToolTip("Stop computing this answer's steering effect (the model stops after its "
                                    "current chunk of tokens)")
        self.stop_button.clicked.connect(self._stop)
        self.again_button = QPushButton("Compute again")
        self.again_button.setAccessibleName("Compute the steering effect again")
        self.again_button.clicked.connect(self._again)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.stop_button)
        lay.addWidget(self.again_button)
        self.setVisible(False)

    def show_state(self, shadows: SteeringShadows | None, conv: Conversation, message: Message, on: bool) -> None:
        """The answer's state while the colouring is `on` (hidden otherwise, and once coloured)."""
        self._shadows, self._conv, self._message = shadows, conv, message
        state = shadows.state(conv, message) if on and shadows is not None and message.is_assistant else None
        self.state = state
        if state is None or state.kind == "done":
            self.setVisible(False)
            return
        self.label.setText(state.text)
        computing = state.kind == "computing"
        self.bar.setVisible(computing or state.kind == "stopped")
        self.bar.setRange(0, max(state.total, 1))
        self.bar.setValue(state.done)
        self.stop_button.setVisible(computing)
        self.again_button.setVisible(state.kind in ("stopped", "failed"))
        self.setVisible(True)

    def _stop(self) -> None:
        if self._shadows is not None and self._message is not None:
            self._shadows.stop(self._message.id)

    def _again(self) -> None:
        shadows, conv, message = self._shadows, self._conv, self._message
        if shadows is not None and conv is not None and message is not None:
            shadows.restart(message.id)
            shadows.kl(conv, message)  # starts the job; the view follows its progress
            self.show_state(shadows, conv, message, True)
