"""A write that fails while an answer streams (disk full, read-only database) never hangs the app.

The store's writes fail on demand through SQLite itself: `PRAGMA query_only`
(every write refused, as on a read-only database) or `PRAGMA max_page_count`
(the database cannot grow: SQLite's "database or disk is full").
"""

from __future__ import annotations

import sqlite3

import pytest

import app.controllers.chat as controller_module
from qt_helpers import close_window, make_window, run_task


def _fail_writes(store, how: str) -> None:
    if how == "read-only":
        store._conn.execute("PRAGMA query_only = ON")
    else:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")


def _allow_writes(store) -> None:
    store._conn.execute("PRAGMA query_only = OFF")
    store._conn.execute("PRAGMA max_page_count = 4294967294")


def _saved(db_path, message_id: int) -> tuple[int, str | None, str]:
    raw = sqlite3.connect(db_path)
    try:
        return raw.execute(
            "SELECT (SELECT COUNT(*) FROM tokens WHERE message_id = ?1), finish_reason, content FROM messages WHERE id = ?1",
            (message_id,),
        ).fetchone()
    finally:
        raw.close()


@pytest.fixture
def long_window(qtbot, qloop, store, host):
    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host, max_new_tokens=2000)
    yield w
    if not w._shutdown_done:
        close_window(qtbot, w)


def _start_answer(qtbot, window, min_tokens: int = 8):
    window.on_send("the cat")
    conv = window.library.current
    qtbot.waitUntil(lambda: len(conv.path()) == 2 and len(conv.path()[1].tokens or ()) >= min_tokens, timeout=10000)
    return conv, conv.path()[1]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["read-only", "disk full"])
def test_failing_writes_stop_the_answer_keep_its_tokens_and_save_them_later(qtbot, long_window, store, db_path,
                                                                           monkeypatch, how):
    monkeypatch.setattr(controller_module, "SAVE_RETRY_S", 0.3)
    window = long_window
    conv, answer = _start_answer(qtbot, window)
    _fail_writes(store, how)
    # The generation ends by itself, cleanly: not "generating…", not busy.
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=10000)
    assert not answer.generating and answer.finish_reason == "cancelled"
    shown = len(answer.tokens)
    assert 8 <= shown < 2000
    # The tokens stay in memory and on screen.
    assert answer.content and answer.content == "".join(t.text for t in answer.tokens)
    body = window.chat.chat_view.widget_for(answer.id).body
    # Compared as words: the mock's text can hold a newline, which the text body lays out as a space.
    tail = " ".join(answer.content.split())[-20:]
    qtbot.waitUntil(lambda: tail in " ".join(body.toPlainText().split()), timeout=3000)
    # The banner says saving failed, and why (SQLite's own words).
    assert window.banner.isVisible()
    why = "readonly" if how == "read-only" else "full"
    assert "Saving failed" in window.banner.label.text() and why in window.banner.label.text()
    saved_tokens, _, _ = _saved(db_path, answer.id)
    assert saved_tokens < shown  # the last batches are only in memory
    # A retry while writes still fail keeps everything and the banner.
    qtbot.wait(700)
    assert window.banner.isVisible() and window.controller.save_error

    _allow_writes(store)  # the disk has room again: the timed retry saves it all
    qtbot.waitUntil(lambda: window.controller.save_error is None, timeout=5000)
    assert not window.banner.isVisible()
    assert _saved(db_path, answer.id) == (shown, "cancelled", answer.content)
    close_window(qtbot, window)
    assert window._shutdown_done and not window.isVisible()


def test_export_retries_saving(qtbot, long_window, store, db_path, tmp_path):
    window = long_window
    conv, answer = _start_answer(qtbot, window)
    _fail_writes(store, "read-only")
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=10000)
    window.export("markdown", tmp_path / "still-failing.md")
    assert window.controller.save_error is not None and window.banner.isVisible()
    _allow_writes(store)
    out = window.export("json", tmp_path / "chat.json")
    assert out.exists() and window.controller.save_error is None and not window.banner.isVisible()
    assert _saved(db_path, answer.id)[0] == len(answer.tokens)


def test_window_quits_while_every_write_fails(qtbot, long_window, store, db_path):
    window = long_window
    conv, answer = _start_answer(qtbot, window)
    _fail_writes(store, "read-only")
    window.close()  # mid-answer, with the geometry, the last tokens and the finish all failing to save
    qtbot.waitUntil(lambda: window._shutdown_done, timeout=15000)
    assert not window.isVisible() and not window.controller.busy
    assert not answer.generating and answer.tokens  # kept in memory to the end
    assert window.controller.save_error is not None
