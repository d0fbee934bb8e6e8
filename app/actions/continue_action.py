"""Chat ▸ Continue answer says which answer it continues, and is off (with the reason) when there is none.

Its text and tip follow the open conversation (app/state/continue_target.py):
"Continue the last answer (512 tokens)" while the last answer of the branch
on screen was cut off; otherwise the item is greyed out and its tip says why.
What it acts on is read again when it is triggered, so it is never stale.
"""

from __future__ import annotations

from PySide6.QtGui import QAction

from app.state.continue_target import ContinueTarget, continue_target
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.observable import Signal


class ContinueAction:
    """Keeps `action`'s text, tip and enabled state on the target of `continue_target`."""

    def __init__(self, action: QAction, library: Library, busy_changed: Signal, busy: bool = False):
        self.action = action
        self._library = library
        self._busy = busy
        self._conv: Conversation | None = None
        library.current_changed.connect(self._on_conversation)
        busy_changed.connect(self._on_busy)
        self._on_conversation(library.current)

    def target(self) -> ContinueTarget:
        return continue_target(self._library.current)

    def refresh(self, *_args: object) -> None:
        target = self.target()
        self.action.setText(target.text)
        self.action.setToolTip(target.tip)
        self.action.setStatusTip(target.tip)
        self.action.setEnabled(target.message is not None and not self._busy)

    def _on_busy(self, busy: bool) -> None:
        self._busy = busy
        self.refresh()

    def _on_conversation(self, conv: Conversation | None) -> None:
        if self._conv is not None:
            self._conv.path_changed.disconnect(self.refresh)
            self._conv.message_changed.disconnect(self._on_message)
        self._conv = conv
        if conv is not None:
            conv.path_changed.connect(self.refresh)
            conv.message_changed.connect(self._on_message)
        self.refresh()

    def _on_message(self, message: Message) -> None:
        conv = self._conv
        if conv is not None and conv.active_child(message.id) is None:  # only the end of a branch can change it
            self.refresh()
