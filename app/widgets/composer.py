"""The message box: Enter sends, Shift+Enter starts a new line; Send turns into Stop while generating."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QToolTip, QVBoxLayout, QWidget


def _is_enter(event: QKeyEvent) -> bool:
    return event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class ComposerEdit(QPlainTextEdit):
    """Enter (and Ctrl+Enter) submits, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if _is_enter(event) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class MessageEdit(ComposerEdit):
    """The box that edits a sent message: keys as in the composer, and Esc cancels.

    The window's own shortcuts (Esc stops an answer, Ctrl+Enter sends the composer's text) would
    take these keys before the box sees them: it claims them while it has the focus.
    """

    cancelled = Signal()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent) and (
            _is_enter(event) or event.key() == Qt.Key.Key_Escape
        ):
            event.accept()  # delivered as a key press to this box, not as the window's shortcut
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._busy = False
        self._blocked: str | None = None  # why nothing may be sent now (an invalid structured-output constraint)
        self.edit = ComposerEdit(self)
        self.edit.setPlaceholderText("Message the model — Enter to send, Shift+Enter for a new line")
        self.edit.setAccessibleName("Message")
        self.edit.setTabChangesFocus(True)
        line = self.edit.fontMetrics().lineSpacing()
        self.edit.setFixedHeight(line * 3 + 14)
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send")
        self.send_button.setToolTip("Send (Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.setVisible(False)

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 6, 12, 10)
        row.addWidget(self.edit, 1)
        row.addLayout(buttons)

        self.edit.submitted.connect(self.submit)
        self.send_button.clicked.connect(self.submit)
        self.stop_button.clicked.connect(self.stop_requested)
        self.edit.textChanged.connect(self._update_buttons)
        self._update_buttons()

    def set_busy(self, busy: bool) -> None:
        """While generating, Send waits (the text stays) and Stop shows."""
        self._busy = busy
        self.stop_button.setVisible(busy)
        self._update_buttons()

    def set_blocked(self, reason: str | None) -> None:
        """While `reason` is set, Send is off and says why; the typed text stays (`SettingsState.constraint_problem`)."""
        self._blocked = reason
        self.send_button.setToolTip(f"Not sent: {reason}" if reason else "Send (Enter)")
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.send_button.setEnabled(not self._busy and not self._blocked and bool(self.edit.toPlainText().strip()))

    def submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text or self._busy:
            return
        if self._blocked:  # Enter while the constraint is invalid: keep the text, say why
            QToolTip.showText(self.send_button.mapToGlobal(self.send_button.rect().center()),
                              f"Not sent: {self._blocked}", self.send_button)
            return
        self.edit.clear()
        self.send_requested.emit(text)
