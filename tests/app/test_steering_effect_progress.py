"""The "Steering effect" colouring shows its progress, can be stopped, and says why an answer is plain (issue 43,
item 5).

The real window on a steerable mock model (tests/app/steerable_mock.py: a delay per steered pass, so the
job over a 140-token answer takes a few chunks to watch). The answer's line says "computing… 64/140 tokens"
with a bar; Stop cancels the engine's work (no further pass runs); Compute again finishes and colours it.
An answer written without steering says so instead of staying plain without a word, also after a restart
with the mode still on.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import steering as steer
from engine.backends.mock import PIECES
from engine.steering import effect

from app.controllers.engine_host import EngineHost
from app.controllers.steering_shadows import NOT_STEERED
from qt_helpers import answered, close_window, make_window, run_task
from steerable_mock import SHAPE, SteerableMock, steerable_factory

ANSWER = 140  # answer tokens: 3 chunks of the shadow (64, 128, 140), two steered passes each


def send(qtbot, w, text: str):
    answer = run_task(qtbot, w.on_send(text))
    qtbot.waitUntil(lambda: answered(w), timeout=15000)
    return answer


def _steered_window(qtbot, store, backend):
    host = EngineHost(steerable_factory(backend))
    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host, max_new_tokens=ANSWER)
    qtbot.waitUntil(lambda: w.controller.steering.can_steer is True, timeout=10_000)
    return host, w


def _vector(w) -> steer.SteeringVector:
    directions = np.ones((SHAPE.n_layer, SHAPE.n_embd), dtype="f4")
    directions[0] = 0
    state = w.controller.steering
    vector = state.add(steer.SteeringVector("push", directions))
    state.set_strength(vector, 2.0)
    return vector


@pytest.mark.slow
def test_the_colouring_shows_progress_and_stops_on_request(qtbot, qloop, store, monkeypatch):
    # Chunks of 64 positions throughout (the mock's small vocabulary would fit the rest in one).
    monkeypatch.setattr(effect, "SHADOW_PASS_BYTES", 64 * 4 * len(PIECES))
    backend = SteerableMock(steer_delay_s=0.25)
    host, w = _steered_window(qtbot, store, backend)
    try:
        vector = _vector(w)
        steered = send(qtbot, w, "hello")
        assert len(w.library.current.tokens(steered)) == ANSWER and steered.request.get("steering")
        w.controller.steering.set_strength(vector, 0.0)
        plain = send(qtbot, w, "and more")
        assert not plain.request.get("steering")

        w.view_options.set_mode("steering")
        w.view_options.set_heatmap(True)
        view = w.chat.chat_view
        line = view.widget_for(steered.id).shadow_status
        # At once: the job has started and says so, before its first chunk is done.
        qtbot.waitUntil(lambda: line.isVisible() and line.state.kind == "computing", timeout=5_000)
        assert line.label.text().startswith("Steering effect: computing…") and line.stop_button.isVisible()
        qtbot.waitUntil(lambda: line.state.done == 64, timeout=10_000)
        assert line.label.text() == f"Steering effect: computing… 64/{ANSWER} tokens"
        assert (line.bar.value(), line.bar.maximum()) == (64, ANSWER)
        # The unsteered answer says why it stays plain.
        other = view.widget_for(plain.id).shadow_status
        assert other.isVisible() and other.state.kind == "not steered" and NOT_STEERED in other.label.text()

        line.stop_button.click()
        qtbot.waitUntil(lambda: line.state.kind == "stopped", timeout=10_000)
        qtbot.wait(800)  # longer than a chunk: a job that went on would have run more passes
        assert backend.steered_calls <= 4  # the chunk under way when Stop came may finish; no third one
        assert line.label.text().startswith("Steering effect: stopped at") and line.again_button.isVisible()
        assert view.widget_for(steered.id).body.steering_kl is None  # not coloured

        line.again_button.click()
        qtbot.waitUntil(lambda: line.state.kind == "done", timeout=20_000)
        assert not line.isVisible()
        kl = view.widget_for(steered.id).body.steering_kl
        assert kl is not None and len(kl) == ANSWER and max(kl) > 0
    finally:
        close_window(qtbot, w)
        host.close()


@pytest.mark.slow
def test_an_unsteered_answer_says_why_after_a_restart_with_the_mode_on(qtbot, qloop, store):
    backend = SteerableMock(steer_delay_s=0.0)
    host, w = _steered_window(qtbot, store, backend)
    try:
        w.settings.set_max_new_tokens(6)
        plain = send(qtbot, w, "hello")
        w.view_options.set_mode("steering")
        w.view_options.set_heatmap(True)
    finally:
        close_window(qtbot, w)
    w = make_window(qtbot, store, host)  # a restart: the mode is read back from the store
    try:
        assert w.view_options.heatmap and w.view_options.mode == "steering"
        qtbot.waitUntil(lambda: w.chat.chat_view.widget_for(plain.id) is not None, timeout=5_000)
        line = w.chat.chat_view.widget_for(plain.id).shadow_status
        assert line.isVisible() and "no steering on this answer" in line.label.text()
        assert backend.steered_calls == 0
    finally:
        close_window(qtbot, w)
        host.close()
