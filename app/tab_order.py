"""Tab and Shift+Tab through what is on screen: past the controls of docks that are closed or tabbed away.

A dock whose tab is behind another stays "visible" to Qt, so Qt's focus
chain walked through its controls unseen: from the composer, 43 of the
Sampling panel's and 13 of the Loom's before the message's Edit button.
`QDockWidget.visibilityChanged` does say when a dock's tab is behind another;
this follows it for the window's docks and steps over what they hold.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QApplication, QDockWidget, QWidget

MAX_SKIPS = 500  # hidden controls skipped in a row at most (more than the window has)


class DocksOnScreen:
    """Which of a window's docks are on screen, and focus moves that skip the others."""

    def __init__(self, window: QWidget):
        self._window = window
        self._off_screen: set[QDockWidget] = set()  # closed, or a tab behind another

    def follow(self, dock: QDockWidget) -> None:
        dock.visibilityChanged.connect(lambda shown, d=dock: self._on_visibility(d, shown))

    def _on_visibility(self, dock: QDockWidget, shown: bool) -> None:
        if shown:
            self._off_screen.discard(dock)
        else:
            self._off_screen.add(dock)

    def shows(self, widget: QWidget) -> bool:
        """`widget` is shown and not inside a dock that is closed or whose tab is behind another."""
        if not widget.isVisible():
            return False
        w: QWidget | None = widget
        while w is not None and w is not self._window:
            if isinstance(w, QDockWidget) and (w in self._off_screen or not w.isVisible()):
                return False
            w = w.parentWidget()
        return True

    def move_focus(self, step: Callable[[], bool]) -> bool:
        """Move the focus with `step` (Qt's own next/previous) until it lands on something on screen."""
        start = QApplication.focusWidget()
        for _ in range(MAX_SKIPS):
            if not step():
                return False
            now = QApplication.focusWidget()
            if now is None or now is start or self.shows(now):
                return True
        return True
