"""The Steering panel stops listening to the steering state and its jobs when Qt deletes it.

The state and the jobs outlive a window (a model's refresh finishes after it closed), and the panel's Python
wrapper can outlive its C++ object (anything that still refers to it keeps it: here the test). Before, the
panel stayed subscribed: the next change of the state ran `_on_state_changed` on deleted widgets and raised
"Internal C++ object (PySide6.QtWidgets.QSlider) already deleted" in whoever changed it (seen as "Task
exception was never retrieved" in tests/app/test_steering_strength_restart.py). On the mock model.
"""

from __future__ import annotations

import numpy as np
import shiboken6
from PySide6.QtCore import QCoreApplication, QEvent
from qt_helpers import close_window

from engine import steering as steer


def _vector(name: str) -> steer.SteeringVector:
    d = np.full((4, 8), 0.5, dtype="f4")
    d[0] = 0
    return steer.SteeringVector(name, d)


def _bound_to(signal, owner) -> list:
    """The slots of an app.state.observable.Signal that are methods of `owner`."""
    return [fn for ref in signal._slots if (fn := ref()) is not None and getattr(fn, "__self__", None) is owner]


def test_a_deleted_panel_is_no_longer_called_by_the_state_or_the_jobs(qtbot, window):
    panel, state, jobs = window.steering_panel, window.controller.steering, window.controller.steering_jobs
    happy = state.add(_vector("happy"))
    state.set_strength(happy, 0.5)
    assert panel._rows[happy.digest].slider.value() == 50  # a row with its slider, as in the restart test
    watched = (state.changed, jobs.training_progress, jobs.training_changed)
    assert all(_bound_to(s, panel) for s in watched)  # it listens while it lives

    close_window(qtbot, window)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert not shiboken6.isValid(panel), "the window's deletion deletes the panel; its wrapper is still here"

    assert [len(_bound_to(s, panel)) for s in watched] == [0, 0, 0]  # counts: a deleted widget has no repr
    # What a strength change, a model's refresh or a training does after the window closed: none reaches the
    # panel (before: RuntimeError "... (PySide6.QtWidgets.QSlider) already deleted" from the first).
    state.set_strength(happy, 1.0)
    state.set_model(None, "", False)
    jobs.training_changed.emit(True)
    jobs.training_progress.emit(1, 2)
    jobs.training_changed.emit(False)
