"""The Steering panel's state (Qt-free) and the panel on a model that cannot steer (the mock model)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import steering as steer

from app.state.steering_state import SteeringState, check_strength


def _vector(name: str, n_layer: int = 4, width: int = 8, scale: float = 1.0) -> steer.SteeringVector:
    d = np.full((n_layer, width), scale, dtype="f4")
    d[0] = 0
    return steer.SteeringVector(name, d)


def test_strength_zero_is_no_steering_and_a_strength_makes_one(tmp_path):
    state = SteeringState()
    v = state.add(_vector("happy"))
    assert state.steering() is None  # listed at 0: the request carries nothing
    state.set_strength(v, 0.75)
    state.set_layers(2, 3)
    s = state.steering()
    assert s.describe() == "happy ×0.75 (layers 2..3)" and s.to_dict()["vectors"][0]["sha256"] == v.digest
    assert state.steering_of(s.to_dict()).key() == s.key()
    state.set_strength(v, 0)
    assert state.steering() is None


def test_bad_values_are_refused_in_words_and_change_nothing():
    state = SteeringState()
    v = state.add(_vector("happy"))
    state.set_strength(v, 1.0)
    for bad, words in ((float("nan"), "finite number"), ("lots", "must be a number"), (50, "beyond ±10"),
                       (float("inf"), "finite number")):
        with pytest.raises(ValueError, match=words):
            state.set_strength(v, bad)
    assert state.strength(v) == 1.0
    with pytest.raises(ValueError, match="empty"):
        state.set_layers(5, 2)
    with pytest.raises(ValueError, match="layer number of 1 or more"):
        state.set_layers(0, None)
    assert (state.layer_start, state.layer_end) == (None, None)
    assert check_strength(" -1.5 ") == -1.5


def test_a_vector_for_another_model_is_refused_and_an_unfit_one_is_not_applied():
    state = SteeringState()
    kept = state.add(_vector("four-layers"))
    state.set_strength(kept, 1.0)
    state.set_model(steer.ResidualShape(6, 8, "llama"), "Model Six", True)
    with pytest.raises(steer.SteeringError, match="made for a model with 4 layers of width 8; Model Six has 6 layers"):
        state.add(_vector("other", scale=3.0))
    assert [v.name for v in state.vectors] == ["four-layers"]
    # Listed before the model changed: it stays, says why, and is not applied.
    assert "Model Six has" in state.rows()[0].unfit and state.steering() is None
    fits = state.add(_vector("six", n_layer=6))
    state.set_strength(fits, 0.5)
    assert state.steering().describe() == "six ×0.5"
    state.set_model(None, "a server", False)  # a model that cannot steer: nothing is applied at all
    assert state.steering() is None


def test_names_stay_apart_and_vectors_are_kept_for_the_next_start(tmp_path):
    folder = tmp_path / "steering"
    state = SteeringState(folder)
    a = state.add(_vector("mood"))
    b = state.add(_vector("mood", scale=2.0))
    assert (a.name, b.name) == ("mood", "mood 2")
    assert state.add(_vector("mood")) is a  # the same numbers: the one listed
    state.remove(a)
    assert state.find(a.digest) is a  # still found for replays this session
    again = SteeringState(folder)  # the next start
    assert {v.digest for v in again.vectors} == {a.digest, b.digest}
    assert all(again.strength(v) == 0 for v in again.vectors)  # a restart never steers by itself
    assert again.find(b.digest) is not None
    (folder / "broken.gguf").write_bytes(b"not a gguf")
    assert len(SteeringState(folder).vectors) == 2  # a broken file is skipped, not fatal


def test_the_panel_says_when_the_model_cannot_steer(qtbot, window):
    panel = window.steering_panel
    qtbot.waitUntil(lambda: window.controller.steering.can_steer is False, timeout=10_000)
    assert "cannot be steered" in panel.note.text() and not panel.train_button.isEnabled()
    v = window.controller.steering.add(_vector("happy"))
    row = panel._rows[v.digest]
    assert not row.slider.isEnabled() and not row.spin.isEnabled()
    window.controller.steering.set_strength(v, 1.0)
    assert window.controller.steering.steering() is None  # nothing rides on the mock model's requests
