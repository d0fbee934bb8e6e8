"""A message bar across the top of the chat: something the user must know now (saving failed, damaged data)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget


class Banner(QFrame):
    """Hidden until `show_message`; one message at a time, with an optional action button."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setAccessibleName("Warning")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        # A warm background from the palette-independent stylesheet: readable in light and dark schemes.
        self.setStyleSheet("#banner { background: #f6d365; } #banner QLabel { color: #3a2a00; }")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # reasons quote paths and error messages
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.label, 1)
        self.action_button = QPushButton()
        self.action_button.setAccessibleName("Banner action")  # its text names it while it shows
        self.action_button.setVisible(False)
        layout.addWidget(self.action_button)
        self.close_button = QPushButton("Dismiss")
        self.close_button.clicked.connect(self.hide)
        layout.addWidget(self.close_button)
        self._action: Callable[[], object] | None = None
        self.action_button.clicked.connect(self._on_action)
        self.kind = ""
        self.setVisible(False)

    def show_message(self, kind: str, text: str, action: str = "", on_action: Callable[[], object] | None = None) -> None:
        """Show `text`; `kind` names the message so it can be cleared by whoever raised it."""
        self.kind = kind
        self.label.setText(text)
        self._action = on_action
        self.action_button.setText(action)
        self.action_button.setVisible(bool(action and on_action))
        self.setVisible(True)

    def clear(self, kind: str) -> None:
        if self.kind == kind:
            self.kind = ""
            self.setVisible(False)

    def _on_action(self) -> None:
        if self._action is not None:
            self._action()
