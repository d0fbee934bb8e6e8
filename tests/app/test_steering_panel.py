"""The Steering panel on the default model (llama.cpp): a vector trained in the panel steers the next answer.

Oracles: the same seed with no vector and with a vector at strength 0 gives the same answer bit for bit
(token ids and log-probs); at strength 2 the tokens differ; the answer's record names the vector (its
content hash) and strength, and says so again when the database is opened anew; a vector file made for
another model is refused in the engine's words and nothing changes.
"""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QColor

from engine import steering as steer

from app.state.conversation_list import Library
from app.state.database.store import Store
from qt_helpers import run_task
from steering_helpers import QUESTION, answer_ids, loaded_vector, regenerate, steer_window, token_records  # noqa: F401

pytest.importorskip("llama_cpp")

@pytest.mark.slow
@pytest.mark.model
def test_a_vector_trained_in_the_panel_steers_the_next_answer_and_is_recorded(qtbot, steer_window, db_path):
    w = steer_window
    panel, state = w.steering_panel, w.controller.steering
    task = w.on_send(QUESTION)
    qtbot.waitUntil(task.done, timeout=120_000)
    plain = task.result()
    assert "steering" not in plain.request

    panel.pairs_box.setCurrentIndex(panel.pairs_box.findData("happy-sad"))
    panel.count_box.setValue(2)
    panel.name_edit.setText("happy")
    panel.train_button.click()
    qtbot.waitUntil(lambda: bool(state.vectors) and not w.controller.steering_jobs.training, timeout=120_000)
    vector = state.vectors[0]
    assert vector.name == "happy" and (vector.n_layer, vector.n_embd) == (30, 576)
    assert "Trained happy from 2 pairs" in panel.message
    row = panel._rows[vector.digest]

    # Listed at strength 0: the next answer is the unsteered one, bit for bit.
    zero = regenerate(qtbot, w)
    assert "steering" not in zero.request
    assert token_records(w, zero) == token_records(w, plain)

    row.spin.setValue(2.0)
    assert row.slider.value() == 200 and state.strength(vector) == 2.0
    assert "happy ×2" in panel.note.text()
    steered = regenerate(qtbot, w)
    assert [t for t, _ in token_records(w, steered)] != [t for t, _ in token_records(w, plain)]
    record = steered.request["steering"]
    assert record["vectors"][0]["name"] == "happy" and record["vectors"][0]["sha256"] == vector.digest
    assert record["vectors"][0]["strength"] == 2.0

    # Saved: a fresh connection to the database reads the same record.
    other = Store(db_path)
    try:
        conv = Library(other).open(w.library.current.id)
        again = conv.messages[steered.id]
        assert again.request["steering"] == record
        assert state.steering_of(again.request["steering"]).describe() == "happy ×2"
        assert "steering" not in conv.messages[plain.id].request
    finally:
        other.close()


@pytest.mark.slow
@pytest.mark.model
def test_a_vector_for_another_model_is_refused_in_words_and_nothing_changes(qtbot, steer_window, tmp_path):
    w = steer_window
    panel, state = w.steering_panel, w.controller.steering
    fits = steer.SteeringVector("fits", np.concatenate([np.zeros((1, 576)), np.full((29, 576), 0.01)]).astype("f4"))
    state.add(fits)
    state.set_strength(fits, 0.5)
    before = (state.vectors, state.steering())

    wrong = tmp_path / "other-model.gguf"
    steer.save_vector(steer.SteeringVector("other", np.concatenate([np.zeros((1, 64)), np.ones((11, 64))]).astype("f4")),
                      wrong)
    run_task(qtbot, panel.load_path(wrong), timeout_ms=30_000)
    assert panel.message.startswith("Not loaded: steering vector 'other-model' was made for a model with 12 layers of width 64")
    assert "SmolLM2-135M-Instruct has 30 layers of width 576" in panel.message
    assert (state.vectors, state.steering()) == before
    assert list(panel._rows) == [fits.digest]

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 7)
    run_task(qtbot, panel.load_path(broken), timeout_ms=30_000)
    assert panel.message.startswith("Not loaded: ") and "broken.gguf" in panel.message
    assert (state.vectors, state.steering()) == before

    # Save…: a llama.cpp control-vector file that reads back as the same numbers.
    saved = tmp_path / "fits-again.gguf"
    run_task(qtbot, panel.save_path(fits, saved), timeout_ms=30_000)
    assert panel.message == f"Saved fits to {saved}." and steer.load_vector(saved).digest == fits.digest

    # A strength that is not a number: said, and the vector keeps its strength.
    panel.set_strength(fits, float("nan"))
    assert "finite number" in panel.message and state.strength(fits) == 0.5


@pytest.mark.slow
@pytest.mark.model
def test_without_steering_in_the_inspector_shows_the_engines_steering_effect(qtbot, steer_window, tmp_path):
    w = steer_window
    vector = loaded_vector(qtbot, w, tmp_path, 1.5)
    task = w.on_send(QUESTION)
    qtbot.waitUntil(task.done, timeout=120_000)
    answer = task.result()
    tokens = w.library.current.tokens(answer)
    assert len(tokens) >= 4 and answer.request["steering"]["vectors"][0]["sha256"] == vector.digest
    view = w.inspector.steering_view

    w.inspector_dock.show()
    w.inspector.tabs.setCurrentWidget(view)
    w.selection.set(answer.id, 3)
    assert "Steered by <b>push ×1.5</b>" in view.status.text()
    assert view.view is None and view.button.isEnabled()  # nothing runs until asked
    view.button.click()
    qtbot.waitUntil(lambda: view.view is not None, timeout=60_000)
    shown = view.view.effect

    prompt, ids = answer_ids(w, answer)
    oracle = w.host.engine.steering_effect(prompt + ids, len(prompt) + 3, steer.Steering.of((vector, 1.5)), top_k=8)
    assert shown.token_id == tokens[3].token_id == oracle.token_id
    # Under the steering, the chosen token's log-prob is the one the decode loop recorded when it wrote it.
    assert shown.steered_logprob == pytest.approx(tokens[3].logprob, abs=2e-3)
    assert (shown.kl, shown.unsteered_logprob, shown.unsteered_rank) == pytest.approx(
        (oracle.kl, oracle.unsteered_logprob, oracle.unsteered_rank), abs=1e-5)
    assert [s.token_id for s in shown.risers] == [s.token_id for s in oracle.risers]
    assert f"<b>{oracle.kl:.3f}</b> nats" in view.summary.text()
    assert view.table.rowCount() == len(oracle.risers) + len(oracle.fallers) > 0

    # The next token selected is computed too (the view stays on), and an unsteered answer is said so.
    w.selection.set(answer.id, 4)
    qtbot.waitUntil(lambda: view.view is not None and view.view.index == 4, timeout=60_000)
    w.steering_panel.all_off()
    plain = regenerate(qtbot, w)
    w.selection.set(plain.id, 1)
    assert "without steering" in view.status.text() and not view.button.isEnabled()


@pytest.mark.slow
@pytest.mark.model
def test_the_token_view_colours_a_steered_answer_by_its_kl_per_token(qtbot, steer_window, tmp_path):
    from PySide6.QtGui import QTextCursor

    from app.theme import is_dark
    from app.widgets.heat import confidence, heat_color

    w = steer_window
    vector = loaded_vector(qtbot, w, tmp_path, 2.0)
    task = w.on_send(QUESTION)
    qtbot.waitUntil(task.done, timeout=120_000)
    answer = task.result()
    w.view_options.set_heatmap(True)
    w.view_options.set_mode("steering")
    shadows = w.controller.steering_jobs.shadows
    conv = w.library.current
    qtbot.waitUntil(lambda: shadows.kl(conv, answer) is not None, timeout=60_000)
    kl = shadows.kl(conv, answer)
    prompt, ids = answer_ids(w, answer)
    oracle = w.host.engine.unsteered_shadow(prompt + ids, len(prompt), steer.Steering.of((vector, 2.0)))
    assert np.allclose(kl, oracle.kl, atol=1e-5) and kl.max() > 0.05

    body = w.chat.chat_view.widget_for(answer.id).body
    qtbot.waitUntil(lambda: body.steering_kl is not None, timeout=10_000)
    dark = is_dark(body.palette())
    tokens = conv.tokens(answer)
    drawn = []
    for i, start in enumerate(body._starts):
        cursor = QTextCursor(body.document())
        cursor.setPosition(start + 1)
        drawn.append(cursor.charFormat().background().color().name(QColor.NameFormat.HexArgb))
        want = heat_color(confidence(tokens[i], "steering", float(kl[i])), dark)
        assert drawn[-1] == want.name(QColor.NameFormat.HexArgb), i
    assert len(set(drawn)) > 1  # the colours follow the KL, not one colour for all

    # An answer without steering has nothing to colour by: no backgrounds, and nothing is computed.
    w.steering_panel.all_off()
    plain = regenerate(qtbot, w)
    assert shadows.kl(conv, plain) is None and plain.id not in shadows._pending
    body = w.chat.chat_view.widget_for(plain.id).body
    assert body.steering_kl is None
    cursor = QTextCursor(body.document())
    cursor.setPosition(body._starts[0] + 1)
    assert cursor.charFormat().background().color().alpha() == 0


@pytest.mark.slow
@pytest.mark.model
def test_training_from_the_users_files_refuses_an_empty_one_and_can_be_cancelled(qtbot, steer_window, tmp_path):
    w = steer_window
    panel, state, jobs = w.steering_panel, w.controller.steering, w.controller.steering_jobs
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    run_task(qtbot, panel.train_from_files([empty]), timeout_ms=30_000)
    assert panel.message == "Not trained: empty.jsonl holds no pairs; each line is {\"positive\": \"...\", \"negative\": \"...\"}"
    assert state.vectors == ()

    # The user's own two text files, one prompt a line: trained off the UI thread, then cancelled midway.
    pos, neg = tmp_path / "calm.txt", tmp_path / "angry.txt"
    pos.write_text("\n".join(f"I feel calm and rested, day {i}." for i in range(40)), encoding="utf-8")
    neg.write_text("\n".join(f"I feel furious and tense, day {i}." for i in range(40)), encoding="utf-8")
    panel.count_box.setValue(40)
    seen: list[tuple[int, int]] = []
    jobs.training_progress.connect(lambda done, total: seen.append((done, total)))
    task = panel.train_from_files([pos, neg])
    qtbot.waitUntil(lambda: bool(seen), timeout=60_000)
    assert panel.cancel_button.isEnabled() and not panel.train_button.isEnabled()
    panel.cancel_button.click()
    qtbot.waitUntil(task.done, timeout=60_000)
    assert panel.message == "Training cancelled." and state.vectors == ()
    assert seen[0][1] == 80 and seen[-1][0] < 80  # 80 prompts read in batches; stopped before the end
    assert panel.train_button.isEnabled() and not panel.cancel_button.isEnabled()


@pytest.mark.slow
@pytest.mark.model
def test_an_answer_streamed_in_the_steering_colouring_is_coloured_when_it_ends(qtbot, steer_window, tmp_path):
    w = steer_window
    loaded_vector(qtbot, w, tmp_path, 2.0)
    w.view_options.set_heatmap(True)
    w.view_options.set_mode("steering")
    task = w.on_send(QUESTION)
    qtbot.waitUntil(task.done, timeout=120_000)
    answer = task.result()
    body = w.chat.chat_view.widget_for(answer.id).body
    qtbot.waitUntil(lambda: body.steering_kl is not None, timeout=60_000)
    assert len(body.steering_kl) == len(w.library.current.tokens(answer))


@pytest.mark.slow
@pytest.mark.model
def test_closing_the_window_while_training_stops_the_training(qtbot, steer_window):
    w = steer_window
    panel, jobs = w.steering_panel, w.controller.steering_jobs
    panel.pairs_box.setCurrentIndex(panel.pairs_box.findData("calm-angry"))
    panel.count_box.setValue(48)
    seen: list[int] = []
    jobs.training_progress.connect(lambda done, total: seen.append(done))
    task = panel.start_training()
    qtbot.waitUntil(lambda: bool(seen), timeout=60_000)
    w.close()
    qtbot.waitUntil(lambda: w._shutdown_done and task.done(), timeout=60_000)
    assert panel.message == "Training cancelled." and w.controller.steering.vectors == ()
