"""The Steering panel's strengths and layer range survive a restart, as the other settings do (issue 43
item 6); before, every vector came back at strength 0."""

from __future__ import annotations

import numpy as np
from qt_helpers import close_window, make_window

from engine import steering as steer


def _vector(name: str, scale: float) -> steer.SteeringVector:
    d = np.full((4, 8), scale, dtype="f4")
    d[0] = 0
    return steer.SteeringVector(name, d)


def test_strengths_and_the_layer_range_are_restored_after_a_restart(qtbot, window, store, host):
    state = window.controller.steering
    assert state.folder is not None  # a database on disk keeps its vectors beside it
    happy, calm = state.add(_vector("happy", 1.0)), state.add(_vector("calm", 2.0))
    state.set_strength(happy, 0.75)
    state.set_strength(calm, -1.5)
    state.set_layers(2, 3)
    close_window(qtbot, window)

    window = make_window(qtbot, store, host)  # the next start
    state = window.controller.steering
    by_name = {v.name: v for v in state.vectors}
    assert {name: state.strength(v) for name, v in by_name.items()} == {"happy": 0.75, "calm": -1.5}
    assert (state.layer_start, state.layer_end) == (2, 3)
    row = window.steering_panel._rows[by_name["happy"].digest]
    assert row.spin.value() == 0.75  # the panel shows what is restored: nothing steers out of sight

    state.set_strength(by_name["happy"], 0)  # and a change is kept again
    close_window(qtbot, window)
    window = make_window(qtbot, store, host)
    state = window.controller.steering
    assert {v.name: state.strength(v) for v in state.vectors} == {"happy": 0.0, "calm": -1.5}
    close_window(qtbot, window)


def test_a_saved_strength_the_state_refuses_is_skipped(qtbot, window, store, host):
    state = window.controller.steering
    v = state.add(_vector("happy", 1.0))
    close_window(qtbot, window)
    store.put_setting("steering", {"strengths": {v.digest: "loud"}, "layers": [5, 1]})  # another version's mess
    window = make_window(qtbot, store, host)
    state = window.controller.steering
    assert [state.strength(x) for x in state.vectors] == [0.0]
    assert (state.layer_start, state.layer_end) == (None, None)
    close_window(qtbot, window)
