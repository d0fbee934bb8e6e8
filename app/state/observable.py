"""A minimal, Qt-free signal: the state layer announces changes, views subscribe.

Views connect bound methods; those are held weakly so a view that is gone
(its Python wrapper collected) silently drops out instead of being called
after its widgets were deleted. Views that are removed while still alive
disconnect explicitly.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Signal:
    """`connect(fn)`, `disconnect(fn)`, `emit(*args)`; callbacks run in connection order."""

    def __init__(self) -> None:
        self._slots: list[Callable[[], Callable[..., Any] | None]] = []

    def connect(self, fn: Callable[..., Any]) -> None:
        ref: Callable[[], Callable[..., Any] | None]
        if hasattr(fn, "__self__") and hasattr(fn, "__func__"):
            ref = weakref.WeakMethod(fn)
        else:
            ref = _Strong(fn)
        self._slots.append(ref)

    def disconnect(self, fn: Callable[..., Any]) -> None:
        self._slots = [r for r in self._slots if (target := r()) is not None and target != fn]

    def emit(self, *args: Any) -> None:
        dead = False
        for ref in list(self._slots):
            fn = ref()
            if fn is None:
                dead = True
                continue
            fn(*args)
        if dead:
            self._slots = [r for r in self._slots if r() is not None]

    def __len__(self) -> int:
        return sum(1 for r in self._slots if r() is not None)


class _Strong:
    """A strong reference with the same call shape as `weakref.WeakMethod` (for lambdas and functions)."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def __call__(self) -> Callable[..., Any]:
        return self._fn
