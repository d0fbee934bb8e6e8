"""Everything survives a fresh window on a fresh database connection; closing mid-answer loses nothing."""

from __future__ import annotations

import json
import sqlite3

import pytest
from PySide6.QtCore import Qt

from app.state.database.store import Store
from qt_helpers import answered, close_window, make_window, send


@pytest.mark.slow
def test_round_trip_through_a_fresh_window_and_connection(qtbot, window, host, store, db_path):
    w1 = window
    conv = w1.library.current
    pane = w1.chat
    qtbot.mouseClick(pane.system_button, Qt.MouseButton.LeftButton)
    pane.system_edit.setPlainText("Answer briefly.")
    qtbot.waitUntil(lambda: conv.system_prompt == "Answer briefly.", timeout=3000)
    temperature = w1.sampling.rows["temperature"].spin
    temperature.setValue(0.45)
    w1.settings.update_sampler(seed=5)
    w1.view_options.set_mode("surprisal")
    w1.view_options.set_heatmap(True)
    first = send(qtbot, w1, "the cat")
    qtbot.keyClick(w1, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)  # regenerate
    qtbot.waitUntil(lambda: answered(w1) and conv.path()[-1] is not first, timeout=10000)
    w1.library.rename(conv.id, "Cats")
    expected_path = [(m.id, m.role, m.content) for m in conv.path()]
    expected_tokens = {m.id: list(conv.tokens(m)) for m in conv.messages.values() if m.is_assistant}
    assert len(expected_tokens) == 2

    w1.new_chat()
    send(qtbot, w1, "the dog")
    other = w1.library.current
    w1.library.open(conv.id)
    close_window(qtbot, w1)
    store.close()

    fresh = Store(db_path)
    try:
        assert fresh._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        w2 = make_window(qtbot, fresh, host)
        c2 = w2.library.current
        assert c2.id == conv.id and c2.title == "Cats" and c2.system_prompt == "Answer briefly."
        assert [(m.id, m.role, m.content) for m in c2.path()] == expected_path
        for mid, tokens in expected_tokens.items():
            assert c2.tokens(c2.messages[mid]) == tokens  # every field, alternatives and stages included
        last = c2.path()[-1]
        assert w2.chat.chat_view.widget_for(last.id).sibling_label.text() == "2 / 2"
        assert w2.settings.options.sampler.temperature == 0.45 and w2.settings.options.sampler.seed == 5
        assert w2.sampling.rows["temperature"].spin.value() == 0.45
        assert w2.view_options.heatmap and w2.view_options.mode == "surprisal"
        assert w2.chat.chat_view.widget_for(last.id).body.mode == "tokens"
        titles = [w2.sidebar.list.item(i).text() for i in range(w2.sidebar.list.count())]
        assert sorted(titles) == sorted(["Cats", other.title])
        assert w2.chat.system_button.text().endswith("●")
        close_window(qtbot, w2)
    finally:
        fresh.close()


def test_closing_mid_answer_stops_and_writes_every_token(qtbot, qloop, host, store, db_path):
    from qt_helpers import run_task

    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host, max_new_tokens=1000)
    w.settings.update_sampler(seed=3)
    w.chat.composer.edit.setPlainText("the cat")
    w.chat.composer.submit()
    conv = w.library.current
    qtbot.waitUntil(lambda: len(conv.path()) == 2 and len(conv.path()[1].tokens or ()) >= 8, timeout=10000)
    answer = conv.path()[1]
    w.close()  # mid-answer
    qtbot.waitUntil(lambda: w._shutdown_done, timeout=10000)
    assert not w.isVisible()
    assert answer.finish_reason == "cancelled"
    # Straight from the file, bypassing the app: every token the window received is there.
    raw = sqlite3.connect(db_path)
    try:
        count, content = raw.execute(
            "SELECT (SELECT COUNT(*) FROM tokens WHERE message_id = ?), content FROM messages WHERE id = ?",
            (answer.id, answer.id),
        ).fetchone()
    finally:
        raw.close()
    assert count == len(answer.tokens) and content == answer.content


def test_export_markdown_and_json_with_token_records(qtbot, window, tmp_path):
    answer = send(qtbot, window, "the cat")
    md = window.export("markdown", tmp_path / "chat.md").read_text()
    assert "## User" in md and "the cat" in md and answer.content.strip() in md
    doc = json.loads(window.export("json", tmp_path / "chat.json").read_text())
    assert doc["format"] == "logitlab.conversation/1"
    exported = next(m for m in doc["messages"] if m["id"] == answer.id)
    assert len(exported["tokens"]) == len(answer.tokens)
    first = exported["tokens"][0]
    assert {"token_id", "prob", "rank", "entropy", "top_model", "top_sampler", "stages"} <= set(first)
    assert exported["model"]["name"] == "mock" and exported["request"]["sampler"]["temperature"] == 0.8  # the default (llama.cpp's)
