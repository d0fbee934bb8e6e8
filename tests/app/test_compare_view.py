"""Compare settings, replay (with a change) and trace export, on the real window with the mock model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtGui import QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QWidget

from engine import Engine
from engine.backends.mock import MockBackend
from engine.experiments import first_divergence, read_trace

from app.controllers.engine_host import EngineHost
from app.actions.experiments import export_trace, open_compare, open_replay
from qt_helpers import close_window, make_window, run_task, send


def _underline_at(body, index: int) -> QTextCharFormat.UnderlineStyle:
    start, _ = body.token_span(index)
    cursor = QTextCursor(body.document())
    cursor.setPosition(start + 1)
    return cursor.charFormat().underlineStyle()


WAVE = QTextCharFormat.UnderlineStyle.WaveUnderline


@pytest.mark.slow
def test_compare_columns_align_mark_the_divergence_and_go_into_the_chat(qtbot, window, closing):
    user_answer = send(qtbot, window, "the cat")
    conv = window.library.current
    user = conv.messages[user_answer.parent_id]
    view = open_compare(window.context)
    closing(view)
    assert len(view.columns) == 2 and "Continues the open conversation" in view.prompt_note.text()
    view.seed.setValue(5)
    view.max_tokens.setValue(16)

    # Two columns with the same settings and seed: identical tokens, no divergence, the prompt computed once.
    run_task(qtbot, view.run())
    a, b = view.columns
    assert a.token_ids and a.token_ids == b.token_ids
    assert view.divergence is None and "identical" in view.status.text()
    assert a.stats.prefilled_tokens == a.stats.prompt_tokens - a.stats.reused_tokens
    assert b.stats.prefilled_tokens == 1  # only the last prompt token, for the first draw's logits

    # Duplicate a column, make it hot and unfiltered: it parts from the others somewhere, and that is marked.
    a.duplicate_button.click()
    assert len(view.columns) == 3
    c = view.columns[2]
    assert c.editor.settings() == a.editor.settings()
    for name, value in (("temperature", 2.5), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
        c.editor.set_value(name, value)
    run_task(qtbot, view.run())
    ids = [col.token_ids for col in view.columns]
    assert ids[0] == ids[1] != ids[2]
    d = view.divergence
    assert d is not None and d == first_divergence(ids)
    for col in view.columns:
        assert _underline_at(col.body, d) == WAVE
        if d > 0:
            assert _underline_at(col.body, d - 1) != WAVE
    assert f"token {d + 1}" in view.status.text()
    assert len(view.summaries) == 3 and view.summaries[2].length == len(ids[2])
    assert f"{view.summaries[2].length} tokens" in c.stats_label.text()

    # Clicking a token shows its alternatives and stages below.
    c.token_clicked.emit(c, d)
    assert view.detail.table.topLevelItemCount() > 0 and "rank" in view.detail.label.text()
    for col in view.columns:  # the same position is selected in every column
        sel = col.body.extraSelections()
        assert sel and sel[0].cursor.selectionStart() == col.body.token_span(d)[0]

    # Up to 4 columns; the fourth disables adding more.
    view.add_column()
    assert len(view.columns) == 4 and not view.add_button.isEnabled() and view.add_column() is None

    # Take the hot column into the chat: a new answer to the same question, shown, the old one kept.
    answer = view.take_into_chat(c)
    assert answer.parent_id == user.id and conv.path()[-1] is answer
    assert [t.token_id for t in conv.tokens(answer)] == ids[2]
    assert answer.content == "".join(e.text for e in c.events)
    assert answer.request["sampler"]["temperature"] == 2.5 and answer.stats["seed"] == 5
    assert len(conv.siblings(answer)) == 2
    assert window.chat.chat_view.widget_for(answer.id) is not None
    view.close()


@pytest.mark.slow
def test_replay_is_identical_and_replay_with_a_change_shows_the_token_diff(qtbot, window, tmp_path, closing):
    window.settings.update_sampler(seed=3, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)
    answer = send(qtbot, window, "the dog")
    conv = window.library.current
    original = [t.token_id for t in conv.tokens(answer)]

    same = open_replay(window.context, with_change=False)
    closing(same)
    qtbot.waitUntil(lambda: same.diff is not None, timeout=15000)
    assert same.replay.token_ids == original and same.diff.identical
    assert "Identical" in same.summary.text()
    same.close()

    changed = open_replay(window.context, with_change=True)
    closing(changed)
    changed.field.setCurrentText("top_k")
    changed.value.setText("1")
    run_task(qtbot, changed.run())
    d = changed.diff
    assert changed.replay_settings().top_k == 1 and changed.replay_settings().seed == 3
    assert d is not None and not d.identical
    i = d.first_divergence
    assert changed.original.token_ids[:i] == changed.replay.token_ids[:i]
    assert _underline_at(changed.original.body, i) == WAVE and _underline_at(changed.replay.body, i) == WAVE
    assert f"token {i + 1}" in changed.summary.text() and "top_k 0 → 1" in changed.summary.text()

    changed.value.setText("lots")
    assert changed.run() is None and "whole number" in changed.summary.text()

    kept = changed.keep()
    assert kept.parent_id == answer.parent_id and [t.token_id for t in conv.tokens(kept)] == changed.replay.token_ids
    changed.close()

    # File ▸ Export trace: the selected answer (the kept replay is now the last one) as JSONL.
    out = export_trace(window.context, tmp_path / "trace.jsonl")
    (run,) = read_trace(out)
    assert run.header["seed"] == 3 and run.header["settings"]["top_k"] == 1 and run.header["prompt_ids"]
    assert [e.token_id for e in run.events()] == [t.token_id for t in conv.tokens(kept)]
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(conv.tokens(kept)) + 2


def test_menus_open_the_experiments(qtbot, window):
    assert window.menu_actions.replay.text() and window.menu_actions.export_trace.text()
    window.menu_actions.replay.trigger()  # nothing answered yet: a message, no window
    assert "no answer" in window.status.currentMessage()
    window.menu_actions.compare.trigger()
    window.menu_actions.score.trigger()
    titles = {w.windowTitle() for w in window.findChildren(QWidget) if w.isWindow() and w.isVisible()}
    assert {"Compare settings", "Score text"} <= titles


def test_replay_on_another_model_names_the_answers_model_and_offers_to_load_it(qtbot, qloop, store, closing):
    def factory(spec, backend, progress):  # two mock "models": the window only sees their ModelInfo
        mock = MockBackend(delay_s=0.01)
        if spec == "other-mock":
            mock.info = replace(mock.info, name="other-mock", spec="other-mock")
        return Engine.from_backend(mock)

    host = EngineHost(factory)
    assert run_task(qtbot, host.load("mock", "mock"))
    window = make_window(qtbot, store, host)
    try:
        answer = send(qtbot, window, "the cat")
        original = [t.token_id for t in window.library.current.tokens(answer)]
        assert run_task(qtbot, host.load("other-mock", "mock")) and host.info.name == "other-mock"

        view = open_replay(window.context, with_change=False)
        closing(view)
        qtbot.waitUntil(view.run_button.isEnabled, timeout=5000)  # the replay ran at once, and was refused
        text = view.summary.text()
        assert "made by mock (mock, float32), but other-mock (mock, float32) is loaded" in text
        assert view.diff is None and view.replay.token_ids == [] and not view.keep_button.isEnabled()
        assert view.load_button.isVisibleTo(view) and "Load mock (mock, float32)" in view.load_button.text()

        run_task(qtbot, view.load_and_replay())
        assert host.info.name == "mock" and not view.load_button.isVisibleTo(view)
        assert view.diff is not None and view.diff.identical and view.replay.token_ids == original
        assert "Identical" in view.summary.text()
        view.close()
    finally:
        close_window(qtbot, window)
        host.close()


def test_closing_a_comparison_mid_run_stops_its_run(qtbot, window, closing):
    view = open_compare(window.context)
    closing(view)
    view.prompt.setPlainText("a new prompt")
    view.max_tokens.setValue(400)
    task = view.run()
    run = view._run
    qtbot.waitUntil(lambda: len(view.columns[0].events) >= 2, timeout=5000)
    assert view.running and not view.run_button.isEnabled()
    view.close()  # the run ends; nothing is drawn into the closed window
    qtbot.waitUntil(task.done, timeout=5000)
    assert not run.running and len(run.columns[0].events) < 400 and run.columns[1].stats is None
