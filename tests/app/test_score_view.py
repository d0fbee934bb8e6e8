"""Score text on the real window with the mock model: colours, perplexity, alternatives, files, bad input."""

from __future__ import annotations

import math

import pytest

from engine.backends.mock import MockBackend
from engine.experiments import score

from app.actions.experiments import open_score
from app.widgets.heat import confidence, heat_color
from qt_helpers import run_task, send
from PySide6.QtGui import QTextCursor


def _background_at(body, position: int):
    cursor = QTextCursor(body.document())
    cursor.setPosition(position + 1)
    return cursor.charFormat().background().color()


def test_score_a_user_message_colours_tokens_by_surprisal(qtbot, window, closing):
    send(qtbot, window, "the quick brown fox jumps over the lazy dog")
    view = open_score(window.context)
    closing(view)
    assert view.messages.count() == 2  # the placeholder and the one user message
    view.messages.setCurrentIndex(1)
    view.messages.activated.emit(1)
    assert view.text.toPlainText() == "the quick brown fox jumps over the lazy dog"
    run_task(qtbot, view.run())

    result = view.result
    want = score(MockBackend(), view.text.toPlainText(), top_n=10)  # an independent model instance
    assert [t.token_id for t in result.tokens] == [t.token_id for t in want.tokens]
    assert [t.logprob for t in result.tokens] == pytest.approx([t.logprob for t in want.tokens])
    assert view.body.rendered_tokens == len(result.tokens) >= 5
    assert f"{want.perplexity:.2f}" in view.summary.text()
    events = result.events()
    for i in (0, len(events) - 1):
        start, _ = view.body.token_span(i)
        assert _background_at(view.body, start).rgba() == heat_color(confidence(events[i], "surprisal"), False).rgba()

    view.body.token_clicked.emit(2)
    t = result.tokens[2]
    assert f"rank {t.rank + 1}" in view.detail.label.text()
    assert view.detail.table.topLevelItemCount() >= 1
    assert math.isclose(t.surprisal_bits, -t.logprob / math.log(2))
    view.close()


def test_score_opens_files_and_refuses_bad_input(qtbot, window, tmp_path, closing):
    view = open_score(window.context)
    closing(view)
    assert view.run() is None and "first" in view.summary.text()  # nothing to score
    good = tmp_path / "t.txt"
    good.write_text(" the cat is a dog", encoding="utf-8")
    assert view.open_file(good) and view.text.toPlainText() == " the cat is a dog"
    bad = tmp_path / "b.bin"
    bad.write_bytes(b"\xff\xfe\x00bad")
    assert not view.open_file(bad) and "not UTF-8" in view.summary.text()
    assert view.text.toPlainText() == " the cat is a dog"  # nothing lost
    run_task(qtbot, view.run())
    assert view.result is not None and len(view.result.tokens) == 4
    view.close()
