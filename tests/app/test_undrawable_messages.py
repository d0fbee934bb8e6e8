"""A stored message the window cannot draw shows as "cannot show this message (why)" and never stops the
window from starting (issue 36 item 1, the drawing half).

The database is a real one; the bad rows are written into it with sqlite3 directly, as an older version's
import or a hand edit left them. Whatever the store's reader lets through must not reach the user as a
traceback at every start.
"""

from __future__ import annotations

import sqlite3

from app.state.conversation_list import Library
from app.widgets.chat.message_widget import MessageWidget
from app.widgets.chat.undrawable_message import UndrawableMessage
from qt_helpers import close_window, make_window, run_task

# (column, stored value): what each answer on the path gets written into it.
POISONS = [
    ("request_json", '{"reasoning": {"markers": 5}}'),  # a mapping, but its reasoning markers are a number
    ("request_json", "[1, 2]"),  # a list where a mapping belongs
    ("model_json", '"a model"'),  # a text where a mapping belongs
    ("stats_json", '{"generated_tokens": 3, "decode_tokens_per_s": "fast"}'),  # a speed that is not a number
    ("branch_index", "x"),  # a text where a token index belongs
]


def poisoned_database(store, db_path) -> list[int]:
    """A chat whose path holds a good exchange, then one answer per poison; returns the path's message ids."""
    conv = Library(store).new()
    parent = conv.add_message(None, "user", "A good question")
    good = conv.add_message(parent, "assistant", "A good answer.")
    conv.update_message(good, finish_reason="eos")
    bad_ids = []
    parent = good
    for i, _ in enumerate(POISONS):
        question = conv.add_message(parent, "user", f"Question {i}")
        parent = conv.add_message(question, "assistant", f"Answer {i}")
        conv.update_message(parent, finish_reason="eos")
        bad_ids.append(parent.id)
    conv.flush()
    with sqlite3.connect(db_path) as db:
        for mid, (column, value) in zip(bad_ids, POISONS):
            db.execute(f"UPDATE messages SET {column} = ? WHERE id = ?", (value, mid))
    return [m.id for m in conv.path()]


def test_poisoned_messages_do_not_stop_the_window_from_starting(qtbot, qloop, store, db_path, host):
    path_ids = poisoned_database(store, db_path)
    assert run_task(qtbot, host.load("mock", "mock"))
    for _start in range(2):  # and again: the next start is not stopped either
        window = make_window(qtbot, store, host)
        try:
            chat = window.chat.chat_view
            shown = chat.message_widgets
            assert [w.message.id for w in shown] == path_ids  # every message has its place, in order
            assert isinstance(shown[0], MessageWidget) and isinstance(shown[1], MessageWidget)
            assert shown[1].body.visible_text().strip() == "A good answer."
            # The reasoning markers that are a number get past the store and fail when drawn: said in a line.
            bad = chat.widget_for(path_ids[3])
            assert isinstance(bad, UndrawableMessage)
            assert bad.text().startswith("cannot show this message (TypeError: ")
            # The others are read without their bad field (the store's reader), the message shown with a line
            # saying what could not be read; or, failing that, shown as undrawable: never a traceback.
            for w in shown[5::2]:
                if isinstance(w, UndrawableMessage):
                    assert w.text().startswith("cannot show this message (")
                else:
                    assert w.message.unreadable and w.body.visible_text().startswith("Answer ")
                    assert "cannot show all of this message (" in w.footer.text() and w.footer.isVisible()
            # Switching the token view on and off redraws every message; the bad ones stay one line.
            window.view_options.set_heatmap(True)
            window.view_options.set_heatmap(False)
            assert isinstance(chat.widget_for(path_ids[3]), UndrawableMessage)
            assert chat.widget_for(path_ids[1]).body.visible_text().strip() == "A good answer."
        finally:
            close_window(qtbot, window)
