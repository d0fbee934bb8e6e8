"""Steering as a knob of Replay and Compare, on the default model (llama.cpp).

Oracles are answers the chat wrote with the same seed: a steered answer replayed with its recorded steering
is identical; replayed at strength 0 it is, token for token, the answer the chat writes with the vector off,
and the diff shows what the steering changed; Compare's first column (the chat's settings and seed) under the
panel's steering is the chat's steered answer, and without it the unsteered one.
"""

from __future__ import annotations

import pytest

from app.actions.experiments import open_compare, open_replay
from qt_helpers import run_task
from steering_helpers import QUESTION, loaded_vector, regenerate, steer_window, token_records  # noqa: F401

pytest.importorskip("llama_cpp")


def _ids(w, message):
    return [t for t, _ in token_records(w, message)]


@pytest.mark.slow
@pytest.mark.model
def test_replay_at_strength_zero_shows_what_steering_changed(qtbot, steer_window, tmp_path, closing):
    w = steer_window
    vector = loaded_vector(qtbot, w, tmp_path, 2.0)
    task = w.on_send(QUESTION)
    qtbot.waitUntil(task.done, timeout=120_000)
    steered = task.result()
    row = w.steering_panel._rows[vector.digest]
    row.spin.setValue(0.0)
    plain = regenerate(qtbot, w)
    assert _ids(w, plain) != _ids(w, steered)
    w.selection.set(steered.id, 0)

    same = open_replay(w.context, with_change=False)
    closing(same)
    assert [b.value() for b in same.steering_knob.boxes] == [2.0] and same.steering_knob.isVisibleTo(same)
    qtbot.waitUntil(lambda: same.diff is not None, timeout=120_000)
    assert same.diff.identical and same.replay.token_ids == _ids(w, steered)

    same.steering_knob.boxes[0].setValue(0.0)
    run_task(qtbot, same.run(), timeout_ms=120_000)
    assert same.replay.token_ids == _ids(w, plain)  # exactly the chat's answer with the vector off
    assert not same.diff.identical and same.diff.first_divergence == next(
        i for i, (a, b) in enumerate(zip(_ids(w, steered), _ids(w, plain))) if a != b)
    assert "steering push ×2 → no steering" in same.summary.text()
    kept = same.keep()
    assert kept is not None and "steering" not in kept.request

    # Kept with its steering: the new version records it as the chat does.
    same.steering_knob.boxes[0].setValue(2.0)
    run_task(qtbot, same.run(), timeout_ms=120_000)
    kept = same.keep()
    assert kept.request["steering"]["vectors"][0]["sha256"] == vector.digest
    assert kept.request["steering"]["vectors"][0]["strength"] == 2.0

    # Its JSONL trace (File ▸ Export trace) says what it ran under; the unsteered one says nothing of steering.
    from app.state.answer_recipe import trace_lines

    conv = w.library.current
    assert trace_lines(conv, steered, None)[0]["steering"] == steered.request["steering"]
    assert "steering" not in trace_lines(conv, plain, None)[0]


@pytest.mark.slow
@pytest.mark.model
def test_compare_runs_every_column_under_the_panels_steering(qtbot, steer_window, tmp_path, closing):
    w = steer_window
    vector = loaded_vector(qtbot, w, tmp_path, 2.0)
    task = w.on_send(QUESTION)
    qtbot.waitUntil(task.done, timeout=120_000)
    steered = task.result()

    view = open_compare(w.context)
    closing(view)
    knob = view.steering_knob
    assert knob.isVisibleTo(view) and knob.use_panel.isChecked() and "push ×2" in knob.use_panel.text()
    view.max_tokens.setValue(16)
    run_task(qtbot, view.run(), timeout_ms=120_000)
    assert view.columns[0].token_ids == _ids(w, steered)
    assert view._run.columns[0].steering is not None

    knob.use_panel.setChecked(False)
    run_task(qtbot, view.run(), timeout_ms=120_000)
    unsteered = view.columns[0].token_ids
    w.steering_panel._rows[vector.digest].spin.setValue(0.0)
    assert not knob.isVisibleTo(view)  # nothing on in the panel: nothing to offer
    plain = regenerate(qtbot, w)
    assert unsteered == _ids(w, plain) != _ids(w, steered)
