"""The main window's layout across sessions: saved when it closes, restored and fitted to the screen it opens on.

Functions on the window (`self` is the `MainWindow`), out of main_window.py, which builds and wires the window.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from PySide6.QtCore import QByteArray

from app.window_geometry import (
    Size, available_rect, clamp_framed, expected_frame, keep_frame_on_screen, rect_of, same_screen_size,
)



# The window is app.main_window.MainWindow (a QMainWindow with `store`, `sampling`, the docks, `size_to_fit`);
# typed Any here so that this module, which main_window imports, does not import it back.
MainWindow = Any

log = logging.getLogger(__name__)

GEOMETRY_KEY = "window_geometry"
DEFAULT_SIZE = (1400, 880)  # the first start's window, where the screen has room for it


def save_layout(self: MainWindow) -> None:
    """Closing: the window's geometry and docks, and the screen's free area it was saved on."""
    free = available_rect(self, by_position=True)
    try:
        self.store.put_setting(
            GEOMETRY_KEY,
            {"geometry": self.saveGeometry().toBase64().data().decode(), "state": self.saveState().toBase64().data().decode(),
             # the screen's free area it was saved on: restored on another size, the layout starts afresh
             "screen": [free.width, free.height] if free is not None else None},
        )
    except sqlite3.Error as e:  # the window closes all the same
        log.warning("could not save the window geometry: %s", e)

def restore_layout(self: MainWindow) -> None:
    """Opening: the saved layout fitted to this screen, or a first start's size."""
    keep_frame_on_screen(self)  # once the window manager has framed it, the frame is on the screen too
    saved = self.store.get_setting(GEOMETRY_KEY)
    if not saved:
        free = available_rect(self)
        if free is None:
            self.size_to_fit(*DEFAULT_SIZE)
        else:
            # The free area less the frame (title bar, borders) the window manager will put around it.
            frame = expected_frame(self)
            self.size_to_fit(free.width - frame.left - frame.right, free.height - frame.top - frame.bottom)
            self.move(free.x, free.y)  # a window's pos() is its frame's: the title bar starts at the top
        return
    self.restoreGeometry(QByteArray.fromBase64(saved["geometry"].encode()))
    self.restoreState(QByteArray.fromBase64(saved["state"].encode()))
    _fit_restored(self, saved.get("screen"))

def _fit_restored(self: MainWindow, saved_screen: object) -> None:
    """A restored layout fits the screen it opens on: saved on a screen of another size, it is sized as a
    first start there (side panels scaled, a small layout grows on a large screen); then it is clamped
    to the screen, so no panel lies past its edge."""
    free = available_rect(self, by_position=True)
    if free is None or self.isMaximized() or self.isFullScreen():
        return
    screen: Size | None = None
    if isinstance(saved_screen, list) and len(saved_screen) == 2 and all(isinstance(v, int) for v in saved_screen):
        screen = Size(*saved_screen)
    if screen is not None and not same_screen_size(screen, free):
        self.size_to_fit(free.width, free.height)
    least = self.minimumSizeHint()
    x, y, width, height = clamp_framed(rect_of(self.geometry()), expected_frame(self), free,
                                       Size(least.width(), least.height()))
    self.setGeometry(x, y, width, height)
