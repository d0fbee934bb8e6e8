"""A line above a served conversation: which client asked, when, through which endpoint; Stop while it streams.

Shown only while the open conversation is one a client's request made (app/controllers/served_conversations.py).
Stop asks the server to end that answer (`ServeController.stop_answer`): the client's stream gets its
last chunk, and the answer here is marked stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.controllers.serve import ServeController
from app.state.conversation import Conversation
from app.state.conversation_list import Library


def describe_served(served: dict[str, Any]) -> str:
    """"Served to 127.0.0.1:50312 at 21:40:07 (chat.completions, SmolLM2)" from a conversation's served record."""
    when = served.get("started_at")
    at = time.strftime(" at %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else ""
    how = ", ".join(str(v) for v in (served.get("endpoint"), served.get("model")) if v)
    via = f" through {served['upstream']}" if served.get("proxied") and served.get("upstream") else ""
    return f"Served to {served.get('client') or 'a client'}{at}{f' ({how})' if how else ''}{via}"


class ServedBar(QFrame):
    def __init__(self, library: Library, serving: ServeController,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("served_bar")
        self.setAccessibleName("Served request")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._library = library
        self._serving = serving
        self._spawn = spawn
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # a client's address and a model's name: text
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop the served answer")
        self.stop_button.setToolTip("End this answer now; the client's stream gets its last chunk")
        self.stop_button.clicked.connect(self.stop)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.stop_button)
        library.current_changed.connect(self._refresh)
        serving.started.connect(self._refresh)
        serving.ended.connect(self._refresh)
        self._refresh()

    def detach(self) -> None:
        self._library.current_changed.disconnect(self._refresh)
        self._serving.started.disconnect(self._refresh)
        self._serving.ended.disconnect(self._refresh)

    def stop(self) -> asyncio.Task | None:
        conv = self._library.current
        if self._serving.live_answer(conv) is None:
            return None
        self.stop_button.setEnabled(False)
        return self._spawn(self._serving.stop_answer(conv))

    def _refresh(self, *_args: Any) -> None:
        conv: Conversation | None = self._library.current
        served = conv.served if conv is not None else None
        self.setVisible(bool(served))
        if not served:
            return
        live = self._serving.live_answer(conv) is not None
        self.label.setText(describe_served(served) + (" — answering…" if live else ""))
        self.stop_button.setVisible(live)
        self.stop_button.setEnabled(live)
