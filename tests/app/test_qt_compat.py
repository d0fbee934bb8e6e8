"""Qt calls must not be able to free None (PySide6 6.12.0 on Python 3.11 leaks a None reference per call)."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject


def test_many_void_qt_calls_leave_none_alive():
    import app.widgets  # noqa: F401 - applies the guard, as every window does

    obj = QObject()
    for _ in range(20_000):  # about what a minute of painting and streaming makes
        obj.setObjectName("x")
    # Unguarded, a leaking build aborts the interpreter before getting here (None starts near 5,000).
    assert sys.getrefcount(None) > 1_000
