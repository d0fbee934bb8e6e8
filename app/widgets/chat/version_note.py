"""Under a message with several versions: "3 later messages are on version 1 ‹ ›".

After a regenerate, an edit or a branch, the turns that followed the other
version vanish from the visible path; this line says where they are. The
link shows that version, the arrows step through the versions.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

from app.state.versions import Elsewhere


def header_button(text: str, tip: str, name: str) -> QToolButton:
    """A flat button of a message's header (the version arrows, Edit, Copy...): its tip and accessible name say it in words."""
    b = QToolButton()
    b.setText(text)
    b.setToolTip(tip)
    b.setAccessibleName(name)
    b.setAutoRaise(True)
    b.setCursor(Qt.CursorShape.PointingHandCursor)
    return b


class VersionNote(QWidget):
    switch_requested = Signal(int)  # how many versions away (negative: earlier)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.RichText)  # our own words and numbers only
        self.label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.label.setAccessibleName("Later messages on another version")
        self.label.linkActivated.connect(lambda _link: self._jump())
        self.prev_button = header_button("‹", "Previous version of this message", "Previous version")
        self.next_button = header_button("›", "Next version of this message", "Next version")
        self.prev_button.clicked.connect(lambda: self.switch_requested.emit(-1))
        self.next_button.clicked.connect(lambda: self.switch_requested.emit(+1))
        row.addWidget(self.label)
        row.addWidget(self.prev_button)
        row.addWidget(self.next_button)
        row.addStretch(1)
        self._offset = 0
        self._enabled = True
        self.setVisible(False)

    def show_note(self, where: Elsewhere | None, can_prev: bool, can_next: bool, enabled: bool) -> None:
        """Say where the later messages are (None: hide); `enabled` is False while a generation runs."""
        self.setVisible(where is not None)
        if where is None:
            return
        self._offset, self._enabled = where.offset, enabled
        link = f"<a href='#version'>version {where.version}</a>"
        self.label.setText(where.text.replace(f"version {where.version}", link))
        self.label.setToolTip(f"Show version {where.version} of this message and the messages after it")
        self.label.setEnabled(enabled)
        self.prev_button.setEnabled(can_prev and enabled)
        self.next_button.setEnabled(can_next and enabled)

    def _jump(self) -> None:
        if self._enabled and self._offset:
            self.switch_requested.emit(self._offset)
