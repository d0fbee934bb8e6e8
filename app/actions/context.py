"""What the window's actions work on, handed to them instead of the window itself.

Menus and actions (open a model, export, compare, replay, score) need the
state, the engine, somewhere to put a dialog and a line in the status bar;
they never need the window's widgets. Giving them this small context keeps
them apart from `main_window.py` (which imports them, never the reverse).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any
from dataclasses import dataclass

from PySide6.QtWidgets import QMessageBox, QWidget

from app.controllers.engine_host import EngineHost
from app.state.conversation_list import Library
from app.state.settings import Selection, SettingsState
from app.state.database.store import Store
from app.state.steering_state import SteeringState

Notify = Callable[[str, int], None]  # (text, milliseconds; 0: until the next): a line in the status bar
Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task]  # run as a task whose failure the window reports


@dataclass(frozen=True)
class ActionContext:
    """The window's state and engine, a parent for dialogs, and the status line."""

    store: Store
    library: Library
    selection: Selection
    host: EngineHost
    settings: SettingsState
    parent: QWidget  # dialogs and views open over it
    notify: Notify
    spawn: Spawn
    steering: SteeringState | None = None  # the Steering panel's vectors (Compare and Replay take them)

    def warn(self, title: str, text: str, name: str = "action_error") -> QMessageBox:
        """One dialog that says what went wrong; opened, not exec()'d (no nested event loop), deleted on close."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=self.parent)
        box.setObjectName(name)
        box.setAccessibleName(title)
        box.finished.connect(box.deleteLater)
        box.open()
        return box
