"""Windows that fit the screen they open on: a saved layout clamped to it, a new window no larger than it.

A layout saved on a 2560-pixel screen and restored on a 1024×700 one put
the inspector past the screen's edge; one saved on the small screen opened
small on the large one. The pure functions here decide the rectangle (tested
without a screen); `fit_to_screen` applies the same rule to a new window
(Replay, Compare, Score) that asks for a size.
"""

from __future__ import annotations

from typing import NamedTuple

from PySide6.QtCore import QRect
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget


class Rect(NamedTuple):
    x: int
    y: int
    width: int
    height: int


class Size(NamedTuple):
    width: int
    height: int


def clamp_rect(rect: Rect, available: Rect, minimum: Size = Size(0, 0)) -> Rect:
    """`rect` made to lie inside `available`: no larger (unless `minimum` is larger still), moved in from its edges.

    Where even the minimum is larger than the screen, the window's top-left corner stays on the screen
    (its title bar can be grabbed, its menus reached).
    """
    width = max(minimum.width, min(rect.width, available.width))
    height = max(minimum.height, min(rect.height, available.height))
    x = max(available.x, min(rect.x, available.x + available.width - width))
    y = max(available.y, min(rect.y, available.y + available.height - height))
    return Rect(x, y, width, height)


def same_screen_size(saved: Size | None, available: Rect) -> bool:
    """Whether a layout saved with the screen's free area `saved` opens on a screen of that size (None: unknown)."""
    return saved is not None and (saved.width, saved.height) == (available.width, available.height)


def rect_of(r: QRect) -> Rect:
    return Rect(r.x(), r.y(), r.width(), r.height())


def available_rect(widget: QWidget, by_position: bool = False) -> Rect | None:
    """The free area (without task bars and docks) of `widget`'s screen; None without a screen.

    `by_position`: the screen under the middle of its geometry (a restored geometry says where it was),
    else the one Qt gave it (a new window opens on its parent's).
    """
    screen = QGuiApplication.screenAt(widget.geometry().center()) if by_position else None
    screen = screen or widget.screen()
    return rect_of(screen.availableGeometry()) if screen is not None else None


def fit_to_screen(widget: QWidget, width: int, height: int) -> None:
    """Resize a new top-level `widget` to width x height, or to its screen's free area where that is smaller."""
    free = available_rect(widget)
    if free is not None:
        hint = widget.minimumSizeHint()
        least = Size(max(widget.minimumWidth(), min(hint.width(), free.width)),
                     max(widget.minimumHeight(), min(hint.height(), free.height)))
        fitted = clamp_rect(Rect(free.x, free.y, width, height), free, least)
        width, height = fitted.width, fitted.height
    widget.resize(width, height)
