"""Windows that fit the screen they open on: a saved layout clamped to it, a new window no larger than it.

A layout saved on a 2560-pixel screen and restored on a 1024×700 one put
the inspector past the screen's edge; one saved on the small screen opened
small on the large one. The pure functions here decide the rectangle (tested
without a screen); `fit_to_screen` applies the same rule to a new window
(Replay, Compare, Score) that asks for a size.

What must fit is the whole window *with its frame*: the window manager's
title bar and borders lie outside `geometry()`. A 1024×700 first start sized
the inside to the free 700 pixels, the title bar came on top, and the status
bar ended below the screen. The frame is known only once the window manager
has framed the window, so a window is sized with its parent's frame (none
for the main window) and refitted, moved and shrunk, when its own frame is
known (`keep_frame_on_screen`).
"""

from __future__ import annotations

from typing import NamedTuple

from PySide6.QtCore import QEvent, QObject, QRect, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

# After a window shows, its frame is looked at again this many ms later: the window manager frames it
# asynchronously (a few ms usually; a busy or remote display takes longer).
REFIT_AFTER_MS = (0, 150, 600)


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


class Margins(NamedTuple):
    """The frame around a window's inside: title bar (top) and borders, in pixels."""

    left: int
    top: int
    right: int
    bottom: int


NO_FRAME = Margins(0, 0, 0, 0)


def clamp_framed(rect: Rect, frame: Margins, available: Rect, minimum: Size = Size(0, 0)) -> Rect:
    """The inside `rect` of a window whose frame is `frame`, made so that the whole framed window lies inside
    `available` (as `clamp_rect`, for the frame). Returns the inside's new rectangle."""
    across, down = frame.left + frame.right, frame.top + frame.bottom
    outer = clamp_rect(Rect(rect.x - frame.left, rect.y - frame.top, rect.width + across, rect.height + down),
                       available, Size(minimum.width + across, minimum.height + down))
    return Rect(outer.x + frame.left, outer.y + frame.top, outer.width - across, outer.height - down)


def frame_of(widget: QWidget) -> Margins | None:
    """`widget`'s frame as the window manager drew it (frameGeometry vs geometry); None before it is framed."""
    if not widget.isVisible():
        return None
    inner, outer = widget.geometry(), widget.frameGeometry()
    return Margins(inner.left() - outer.left(), inner.top() - outer.top(),
                   outer.right() - inner.right(), outer.bottom() - inner.bottom())


def expected_frame(widget: QWidget) -> Margins:
    """The frame `widget` will likely get before it has one: its parent window's (framed by the same window
    manager), else none known (`keep_frame_on_screen` corrects the size once the frame is there)."""
    parent_widget = widget.parentWidget()
    parent = parent_widget.window() if parent_widget is not None else None
    known = frame_of(parent) if parent is not None else None
    return known if known is not None else NO_FRAME


def refit_to_frame(widget: QWidget) -> bool:
    """Move and shrink a shown window so that it and its frame lie inside its screen's free area.

    True when it had to. Only what the frame adds is corrected: nothing is done to a maximized or full-screen
    window, one with no frame (not yet framed, or no window manager: its size before showing was right), or
    one whose inside alone is larger than the free area (sized so on purpose).
    """
    frame = frame_of(widget)
    free = available_rect(widget, by_position=True)
    if frame in (None, NO_FRAME) or free is None or widget.isMaximized() or widget.isFullScreen():
        return False
    now = rect_of(widget.geometry())
    if now.width > free.width or now.height > free.height:
        return False
    least = widget.minimumSizeHint()
    fitted = clamp_framed(now, frame, free, Size(max(widget.minimumWidth(), least.width()),
                                                 max(widget.minimumHeight(), least.height())))
    if fitted == now:
        return False
    widget.setGeometry(fitted.x, fitted.y, fitted.width, fitted.height)
    return True


class _RefitOnShow(QObject):
    """Refits its window a few times after each show (the frame arrives after the window does)."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Show and watched is self.parent():
            for delay in REFIT_AFTER_MS:
                QTimer.singleShot(delay, self, self._refit)
        return False

    def _refit(self) -> None:
        window = self.parent()  # the widget it was made for (keep_frame_on_screen)
        if isinstance(window, QWidget):
            refit_to_frame(window)


def keep_frame_on_screen(widget: QWidget) -> None:
    """From now on, whenever `widget` (a top-level window) shows, its frame is brought onto its screen."""
    if widget.findChild(_RefitOnShow) is None:
        widget.installEventFilter(_RefitOnShow(widget))


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
    """Resize a new top-level `widget` to width x height, or to its screen's free area where that is smaller,
    frame included; once shown, its real frame is brought onto the screen (`keep_frame_on_screen`)."""
    free = available_rect(widget)
    if free is not None:
        frame = expected_frame(widget)
        hint = widget.minimumSizeHint()
        room = Size(free.width - frame.left - frame.right, free.height - frame.top - frame.bottom)
        least = Size(max(widget.minimumWidth(), min(hint.width(), room.width)),
                     max(widget.minimumHeight(), min(hint.height(), room.height)))
        fitted = clamp_framed(Rect(free.x + frame.left, free.y + frame.top, width, height), frame, free, least)
        width, height = fitted.width, fitted.height
    widget.resize(width, height)
    keep_frame_on_screen(widget)
