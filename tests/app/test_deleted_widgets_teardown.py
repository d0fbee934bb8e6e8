"""A delete-on-close window a test closed itself does not fail the teardown (CI's Python 3.13 failure, stop 50).

The window is held by qtbot, closed by the test, deleted by Qt, and its Python wrapper kept alive, as a cycle
did on CI while automatic garbage collection was off: pytest-qt's teardown then called `close()` on a deleted
C++ object ("Internal C++ object (ModelDiffView) already deleted") and failed the next test's setup too.
tests/app/conftest.py's teardown hook forgets such widgets; without it this test errors at teardown.
"""

from __future__ import annotations

import shiboken6
from PySide6.QtCore import QCoreApplication, QEvent, Qt
from PySide6.QtWidgets import QWidget

_kept_alive: list[QWidget] = []  # the wrapper outlives its C++ object, as the cycle held it on CI


def test_a_closed_delete_on_close_window_held_by_qtbot_is_not_closed_again(qtbot):
    window = QWidget()
    window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    qtbot.addWidget(window)
    _kept_alive.append(window)
    window.show()
    window.close()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert not shiboken6.isValid(window)  # deleted by Qt, wrapper still here: the state CI's teardown met


def test_the_next_test_sets_up_cleanly(qtbot):
    live = QWidget()
    qtbot.addWidget(live)
    assert shiboken6.isValid(live) and _kept_alive and not shiboken6.isValid(_kept_alive[0])
