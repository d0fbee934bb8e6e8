"""Shared pieces of the steering window tests: the default model on llama.cpp in a window, a loaded vector."""

from __future__ import annotations

import numpy as np
import pytest

from engine import steering as steer

from app.controllers.engine_host import EngineHost
from qt_helpers import close_window, make_window, run_task

QUESTION = "Write one sentence about your morning."


def regenerate(qtbot, w):
    before = w.library.current.path()[-1]
    task = w.on_regenerate(before)
    qtbot.waitUntil(task.done, timeout=120_000)
    answer = task.result()
    assert answer is not None and answer.finish_reason != "error", answer and answer.stats
    return answer


def token_records(w, message):
    return [(t.token_id, t.logprob) for t in w.library.current.tokens(message)]


@pytest.fixture
def steer_window(qtbot, qloop, store):
    host = EngineHost()  # the production factory: the default model on llama.cpp
    w = make_window(qtbot, store, host, max_new_tokens=16)
    task = w.start(None, "llamacpp")
    qtbot.waitUntil(task.done, timeout=120_000)
    assert task.result() is True
    qtbot.waitUntil(lambda: w.controller.steering.can_steer is True, timeout=30_000)
    w.settings.update_sampler(seed=11, temperature=0.9)
    yield w
    close_window(qtbot, w)
    host.close()


def loaded_vector(qtbot, w, tmp_path, strength: float):
    """A vector loaded through the panel (a fixed random direction per layer), at `strength`."""
    rng = np.random.default_rng(5)
    directions = rng.standard_normal((30, 576)).astype("f4")
    directions[0] = 0
    directions *= 4.0 / np.linalg.norm(directions, axis=1, keepdims=True).clip(1e-6)
    path = tmp_path / "push.gguf"
    steer.save_vector(steer.SteeringVector("push", directions), path)
    run_task(qtbot, w.steering_panel.load_path(path), timeout_ms=30_000)
    vector = w.controller.steering.vectors[-1]
    assert vector.name == "push", w.steering_panel.message
    w.steering_panel._rows[vector.digest].spin.setValue(strength)
    return vector


def answer_ids(w, message):
    from app.state.notebook import prompt_for

    conv = w.library.current
    prompt = prompt_for(conv, conv.messages[message.parent_id]).token_ids(w.host.engine.tokenizer)
    return prompt, [t.token_id for t in conv.tokens(message)]
