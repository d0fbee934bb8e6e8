"""Esc closes a tool window (Compare, Replay, Score), as it does a dialog."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QWidget


def close_on_escape(window: QWidget) -> QShortcut:
    """Esc anywhere in `window` closes it (its closeEvent stops what it runs first)."""
    shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), window)
    shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
    shortcut.activated.connect(window.close)
    return shortcut
