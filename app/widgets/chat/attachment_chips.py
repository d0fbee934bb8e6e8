"""Attached files as chips: name, size and tokens, with a ✕ to take one off before sending (the composer's
row), or read-only under a sent message. The reading and checking is the engine's (engine/documents)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

from engine import documents


def chip_text(attachment: documents.Attachment, tokens: int | None) -> str:
    """'notes.md · 1.2 KB · 312 tokens' ('… tokens' while counted, without them where none can be counted)."""
    count = "" if tokens == -1 else " · … tokens" if tokens is None else f" · {tokens:,} tokens"
    return f"{attachment.name} · {attachment.size_text()}{count}"


class AttachmentChip(QFrame):
    remove_requested = Signal(str)  # (sha256)

    def __init__(self, attachment: documents.Attachment, removable: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.attachment = attachment
        self.tokens: int | None = None
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName(f"Attachment {attachment.name}")
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # a file's name is never markup
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 1, 2 if removable else 6, 1)
        lay.setSpacing(2)
        lay.addWidget(self.label)
        self.remove_button: QToolButton | None = None
        if removable:
            self.remove_button = QToolButton()
            self.remove_button.setText("✕")
            self.remove_button.setAutoRaise(True)
            self.remove_button.setToolTip(f"Remove {attachment.name}")
            self.remove_button.setAccessibleName(f"Remove {attachment.name}")
            self.remove_button.clicked.connect(lambda: self.remove_requested.emit(attachment.sha256))
            lay.addWidget(self.remove_button)
        self.set_tokens(None if removable else -1)

    def set_tokens(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.label.setText(chip_text(self.attachment, tokens))
        kind = "PDF text" if self.attachment.media_kind == "pdf" else self.attachment.media_kind
        self.setToolTip(f"{self.attachment.name}: {self.attachment.size:,} bytes, {kind}, "
                        f"{len(self.attachment.text):,} characters\nSHA-256 {self.attachment.sha256}")


class ChipRow(QWidget):
    """A row of chips (hidden while empty)."""

    remove_requested = Signal(str)

    def __init__(self, removable: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self._removable = removable
        self.chips: list[AttachmentChip] = []
        self._lay = QHBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(4)
        self._lay.addStretch(1)
        self.setVisible(False)

    def set_attachments(self, attachments: list[documents.Attachment]) -> None:
        for chip in self.chips:
            self._lay.removeWidget(chip)
            chip.deleteLater()
        self.chips = []
        for a in attachments:
            chip = AttachmentChip(a, self._removable, self)
            chip.remove_requested.connect(self.remove_requested)
            self._lay.insertWidget(self._lay.count() - 1, chip)
            self.chips.append(chip)
        self.setVisible(bool(attachments))

    def chip(self, sha256: str) -> AttachmentChip | None:
        return next((c for c in self.chips if c.attachment.sha256 == sha256), None)
