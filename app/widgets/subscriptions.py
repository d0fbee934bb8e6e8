"""Subscriptions of a widget to state that outlives it (`app.state.observable.Signal`).

A `Signal` holds bound methods weakly, but a widget's Python wrapper can outlive
its C++ object (Qt deletes the children of a closed window; the wrapper stays
while anything refers to it), and a call then fails with "already deleted". The
engine host outlives a window (another window may be open on it), so a widget
that listens to it disconnects when Qt destroys it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QObject

from app.state.observable import Signal


def follow(owner: QObject, subscriptions: Sequence[tuple[Signal, Callable[..., Any]]]) -> None:
    """Connect each (signal, slot) now, and disconnect them all when `owner` is destroyed."""
    pairs = tuple(subscriptions)
    for signal, slot in pairs:
        signal.connect(slot)

    def drop(*_args: Any) -> None:
        for signal, slot in pairs:
            signal.disconnect(slot)

    owner.destroyed.connect(drop)
