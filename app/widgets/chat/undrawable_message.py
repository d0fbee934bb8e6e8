"""What the transcript shows in place of a stored message it cannot draw.

A database written by an older version, or poisoned by a bad import, can hold
a message whose fields are not what the window expects (a request that is a
list, stats that are not numbers, a branch index that is text). Drawing it
raises; the transcript catches that and shows this line instead, so one bad
message never keeps the window from opening or the rest of the chat from
showing.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QWidget

from app.state.conversation import Message

WHY_CHARS = 200  # an error's text can quote the bad value: a line, not a page


def cannot_show_text(error: BaseException) -> str:
    why = " ".join(f"{type(error).__name__}: {error}".split())
    if len(why) > WHY_CHARS:
        why = why[: WHY_CHARS - 1] + "…"
    return f"cannot show this message ({why})"


class UndrawableMessage(QLabel):
    """A one-line stand-in with the `MessageWidget` calls the transcript makes, each doing nothing."""

    def __init__(self, message: Message, error: BaseException, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.error = error
        self.setTextFormat(Qt.TextFormat.PlainText)  # the reason may quote stored text
        self.setWordWrap(True)
        self.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.setText(cannot_show_text(error))
        self.setAccessibleName("Message that cannot be shown")
        self.setContentsMargins(14, 8, 14, 8)

    def set_view(self, heatmap: bool, heat_mode: str, dark: bool) -> None:
        pass

    def set_busy(self, busy: bool) -> None:
        pass

    def set_selected(self, index: int | None) -> None:
        pass

    def refresh(self) -> None:
        pass

    def update_chrome(self) -> None:
        pass

    def on_tokens_appended(self) -> None:
        pass
