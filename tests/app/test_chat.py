"""Send, stream, stop, regenerate, continue, edit: the chat pane against the mock model."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.state.database.store import Store
from qt_helpers import answered, send


@pytest.mark.slow
def test_send_streams_tokens_into_the_view_and_saves_them_while_streaming(qtbot, window, db_path):
    window.settings.set_max_new_tokens(300)
    window.settings.update_sampler(seed=3)  # the mock answer is then long enough to watch it stream
    edit = window.chat.composer.edit
    edit.setPlainText("the cat")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert edit.toPlainText() == ""  # Enter sent it

    conv = window.library.current
    qtbot.waitUntil(lambda: len(conv.path()) == 2 and len(conv.path()[1].tokens or ()) >= 40, timeout=10000)
    answer = conv.path()[1]
    assert answer.generating, "the answer should still be streaming"
    widget = window.chat.chat_view.widget_for(answer.id)
    shown = widget.body.toPlainText()
    # Words, not line breaks: the mock's text can hold a newline, which the text body lays out as a space.
    assert shown and " ".join(answer.content.split()).startswith(" ".join(shown.split())[:20])  # partial text is on screen
    assert window.chat.composer.stop_button.isVisible()
    # Written while streaming: a separate connection already sees token rows.
    qtbot.waitUntil(lambda: Store(db_path).token_count(answer.id) > 0, timeout=2000)

    qtbot.waitUntil(lambda: answered(window), timeout=15000)
    assert answer.finish_reason in ("eos", "length")
    tokens = conv.tokens(answer)
    assert answer.content == "".join(t.text for t in tokens)
    assert [t.index for t in tokens] == list(range(len(tokens)))
    assert all(t.stages for t in tokens), "stage snapshots are recorded for every token"
    widget.body.finish()
    # The body is Markdown: a lone newline inside a paragraph shows as a space.
    assert widget.body.toPlainText().split() == answer.content.split()
    assert "tok/s" in widget.footer.text()

    # The stage records the flushes left out are written in slices once the answer has ended.
    qtbot.waitUntil(lambda: not conv.has_due_stages, timeout=5000)
    fresh = Store(db_path)
    try:
        rows = fresh.messages(conv.id)
        assert [r.role for r in rows] == ["user", "assistant"]
        assert rows[0].content == "the cat"
        assert rows[1].content == answer.content and rows[1].finish_reason == answer.finish_reason
        assert rows[1].request["sampler"]["seed"] == 3 and rows[1].model["name"] == "mock"
        assert fresh.tokens(answer.id) == tokens
    finally:
        fresh.close()


def test_stop_cancels_within_a_token_and_keeps_what_was_generated(qtbot, window, db_path):
    window.settings.set_max_new_tokens(1000)
    window.settings.update_sampler(seed=3)
    edit = window.chat.composer.edit
    edit.setPlainText("the cat")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    conv = window.library.current
    qtbot.waitUntil(lambda: len(conv.path()) == 2 and len(conv.path()[1].tokens or ()) >= 5, timeout=10000)
    answer = conv.path()[1]
    seen = len(answer.tokens)
    qtbot.keyClick(window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: answered(window), timeout=5000)

    assert answer.finish_reason == "cancelled"
    # Tokens already on their way (one frame, one forward pass) may still land; no more.
    assert seen <= len(answer.tokens) <= seen + 3
    assert not window.chat.composer.stop_button.isVisible()
    widget = window.chat.chat_view.widget_for(answer.id)
    assert "stopped" in widget.footer.text()
    assert widget.continue_button.isVisible()
    fresh = Store(db_path)
    try:
        assert fresh.token_count(answer.id) == len(answer.tokens)
        assert fresh.messages(conv.id)[1].finish_reason == "cancelled"
    finally:
        fresh.close()


def test_regenerate_adds_a_sibling_and_the_arrows_switch_between_them(qtbot, window):
    first = send(qtbot, window, "the dog")
    original = first.content
    widget = window.chat.chat_view.widget_for(first.id)
    assert not widget.sibling_label.isVisible()

    qtbot.mouseClick(widget.regen_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(window) and window.library.current.path()[-1] is not first, timeout=10000)
    conv = window.library.current
    second = conv.path()[-1]
    assert second.parent_id == first.parent_id
    assert [m.id for m in conv.siblings(second)] == [first.id, second.id]
    w2 = window.chat.chat_view.widget_for(second.id)
    assert w2.sibling_label.isVisible() and w2.sibling_label.text() == "2 / 2"
    assert not w2.next_button.isEnabled() and w2.prev_button.isEnabled()

    qtbot.mouseClick(w2.prev_button, Qt.MouseButton.LeftButton)
    assert conv.path()[-1] is first
    w1 = window.chat.chat_view.widget_for(first.id)
    assert w1.sibling_label.text() == "1 / 2"
    w1.body.finish()
    assert w1.body.toPlainText().split() == original.split()  # the words (a newline in the text shows as a space)


def test_continue_extends_a_cut_off_answer_in_place(qtbot, window):
    window.settings.set_max_new_tokens(6)
    answer = send(qtbot, window, "the cat")
    assert answer.finish_reason == "length" and len(answer.tokens) == 6
    head = answer.content
    widget = window.chat.chat_view.widget_for(answer.id)
    qtbot.mouseClick(widget.continue_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(window) and len(answer.tokens) > 6, timeout=10000)
    assert answer.content.startswith(head) and len(answer.content) > len(head)
    assert [t.index for t in answer.tokens] == list(range(len(answer.tokens)))
    assert len(window.library.current.path()) == 2  # in place, not a new message


def test_edit_and_resend_branches_the_user_message(qtbot, window):
    send(qtbot, window, "the cat")
    conv = window.library.current
    user = conv.path()[0]
    widget = window.chat.chat_view.widget_for(user.id)
    qtbot.mouseClick(widget.edit_button, Qt.MouseButton.LeftButton)
    assert widget.editor.isVisible()
    widget.editor.setPlainText("the dog")
    qtbot.mouseClick(widget.edit_send, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(window) and conv.path()[0] is not user, timeout=10000)
    edited = conv.path()[0]
    assert edited.content == "the dog" and edited.parent_id is None
    assert [m.id for m in conv.siblings(edited)] == [user.id, edited.id]
    assert window.chat.chat_view.widget_for(edited.id).sibling_label.text() == "2 / 2"
    assert user.content == "the cat"  # the original stays
