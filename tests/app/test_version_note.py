"""After a regenerate, an edit or a branch, the conversation says where the later messages went:
"3 later messages are on version 1 ‹ ›", and a click there shows them."""

from __future__ import annotations

import re

from PySide6.QtCore import QPoint, Qt


def _widget(qtbot, window, message):
    widget = window.chat.chat_view.widget_for(message.id)
    qtbot.waitUntil(lambda: widget.isVisible() and widget.width() > 300, timeout=5000)
    return widget


def test_after_a_branch_the_conversation_says_where_the_later_messages_are(qtbot, window):
    conv = window.library.current
    u1 = conv.add_message(None, "user", "first question")
    a1 = conv.add_message(u1, "assistant", "first answer")
    u2 = conv.add_message(a1, "user", "second question")
    conv.add_message(u2, "assistant", "second answer")
    for m in conv.path():
        conv.update_message(m, finish_reason="eos")
    a1b = conv.add_message(u1, "assistant", "another first answer")  # a regenerate or a branch from a token
    conv.update_message(a1b, finish_reason="eos")
    assert [m.content for m in conv.path()] == ["first question", "another first answer"]

    widget = _widget(qtbot, window, a1b)
    row, label = widget.version_note, widget.version_note.label
    assert row.isVisible() and _words(label) == "2 later messages are on version 1"
    assert widget.version_note.prev_button.isEnabled() and not widget.version_note.next_button.isEnabled()
    # A click on "version 1" shows that version and the turns after it.
    qtbot.mouseClick(label, Qt.MouseButton.LeftButton, pos=_link_point(label))
    assert [m.content for m in conv.path()] == ["first question", "first answer", "second question", "second answer"]
    # On version 1 nothing went elsewhere (version 2 has no later messages): no note.
    assert not window.chat.chat_view.widget_for(a1.id).version_note.isVisible()

    # An edited question: the old one's three later messages are on version 1; the arrows switch too.
    u1b = conv.add_message(None, "user", "first question, edited")
    widget = _widget(qtbot, window, u1b)
    assert _words(widget.version_note.label) == "3 later messages are on version 1"
    qtbot.mouseClick(widget.version_note.prev_button, Qt.MouseButton.LeftButton)
    assert conv.path()[0] is u1 and len(conv.path()) == 4
    assert not window.chat.chat_view.widget_for(u1.id).version_note.isVisible()  # version 2 holds no later message


def _words(label) -> str:
    return re.sub(r"<[^>]+>", "", label.text())


def _link_point(label):
    """A point on the label's link ("version N" ends its text)."""
    before = label.text().split("<a")[0]
    x = label.contentsRect().left() + label.fontMetrics().horizontalAdvance(before + "ver")
    return QPoint(x, label.height() // 2)
