"""A message selected far up a long chat is drawn in a page around it, not with everything below it.

Before: selecting a message far up the path (a loom node opened there) drew every message from it to the end,
3,000 widgets for a 3,000-message chat, 37 s of the window frozen. Now the chat view draws a window of `PAGE`
messages around it with "Show later messages" below; a new turn goes back to the end, and the loom opening a
node far up (the branch switched and the node selected in one gesture) draws that node's message.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from big_conversations import token
from qt_helpers import answered

from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.widgets.chat.chat_view import PAGE
from app.widgets.chat.message_widget import MessageWidget

pytestmark = pytest.mark.slow  # each writes a chat of a few hundred messages and opens it in the window


def _turns(conv: Conversation, parent: Message | None, turns: int, tag: str) -> Message | None:
    """`turns` questions with their answers below `parent`; returns the last answer."""
    for t in range(turns):
        question = conv.add_message(parent, "user", f"Question {tag}{t}?")
        parent = conv.add_message(question, "assistant")
        tokens = [token(0, 30, f"Answer {tag}{t}"), token(1, 31, " here.")]
        conv.set_tokens(parent, tokens, "".join(t.text for t in tokens))
        conv.update_message(parent, finish_reason="eos")
    return parent


def _open(qtbot, window, conv: Conversation) -> list[Message]:
    conv.flush()
    window.library.open(conv.id)
    qtbot.waitUntil(lambda: window.library.current is not None and window.library.current.id == conv.id)
    return window.library.current.path()


def _page(chat) -> list[Message]:
    return [w.message for w in chat.message_widgets]


def test_a_far_up_selection_draws_a_page_around_it_and_show_later_goes_toward_the_end(qtbot, window, store):
    conv = Library(store).new()
    _turns(conv, None, 100, "")  # 200 messages on the path
    path = _open(qtbot, window, conv)
    chat = window.chat.chat_view
    assert _page(chat) == path[-PAGE:] and not chat.later_button.isVisible()  # the usual case: the last page
    window.selection.set(path[50].id, 0)  # a token of an answer far up, chosen in the inspector or the loom
    assert _page(chat) == path[40:60] and chat.widget_for(path[50].id) is not None
    selected = chat.widget_for(path[50].id)
    qtbot.waitUntil(lambda: chat.viewport().rect().contains(  # scrolled to, not left at the bottom
        selected.mapTo(chat.viewport(), selected.rect().topLeft())), timeout=2000)
    assert chat.earlier_button.isVisible() and chat.earlier_button.text() == "Show 20 earlier messages (40 not shown)"
    later = chat.later_button
    assert later.isVisible() and later.accessibleName() == "Show later messages"
    assert later.text() == "Show 20 later messages (140 not shown)" and chat.later_count == 140
    later.click()
    assert _page(chat) == path[40:80] and later.text() == "Show 20 later messages (120 not shown)"
    chat.earlier_button.click()  # earlier ones above the window, as at the end
    assert _page(chat) == path[20:80] and chat.hidden_count == 20
    for _ in range(10):  # bounded: six clicks reach the end
        if not later.isVisible():
            break
        later.click()
    assert _page(chat) == path[20:] and not later.isVisible() and chat.later_count == 0
    qtbot.wait(50)
    assert len(chat.findChildren(MessageWidget)) == len(path) - 20  # the widgets replaced are gone


def test_a_new_turn_after_a_far_up_selection_goes_back_to_the_end(qtbot, window, store):
    conv = Library(store).new()
    _turns(conv, None, 60, "")
    path = _open(qtbot, window, conv)
    chat = window.chat.chat_view
    window.selection.set(path[9].id, 1)
    assert _page(chat) == path[0:20] and chat.later_button.isVisible()
    window.selection.set(path[-1].id, 0)  # the last answer selected from up there: the end page, as it was
    assert _page(chat) == path[-PAGE:] and not chat.later_button.isVisible()
    window.selection.set(path[9].id, 1)
    assert _page(chat) == path[0:20]
    window.on_send("And one more?")  # as the composer's Enter does
    qtbot.waitUntil(lambda: len(window.library.current.path()) == len(path) + 2 and answered(window), timeout=15000)
    now = window.library.current.path()
    assert now[-2].content == "And one more?" and now[-1].is_assistant and now[-1].tokens
    assert _page(chat) == now[-PAGE:]  # the question and its answer, at the end where they are
    assert not chat.later_button.isVisible() and chat.hidden_count == len(now) - PAGE
    bar = chat.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)


def test_the_loom_opening_a_node_far_up_draws_its_message(qtbot, window, store):
    conv = Library(store).new()
    first = _turns(conv, None, 3, "")
    fork = conv.add_message(first, "user", "Which way?")
    mine = _turns_from(conv, fork, "a")
    other = _turns_from(conv, fork, "b")
    conv.show(mine[-1])  # the chat runs through the first answer; the other has 60 turns of its own below it
    path = _open(qtbot, window, conv)
    chat, view = window.chat.chat_view, window.loom_view
    window.loom_dock.raise_()
    window.selection.set(mine[0].id, 0)  # the fork's first answer, clicked: the loom shows the fork's answers
    assert chat.widget_for(mine[0].id) is not None
    window.on_send("Go on?")  # a turn at the end of this branch: the chat back at its end, the loom on the fork
    qtbot.waitUntil(lambda: len(window.library.current.path()) == len(path) + 2 and answered(window), timeout=15000)
    path = window.library.current.path()
    assert _page(chat) == path[-PAGE:] and path[7].id == mine[0].id and window.selection.message_id == mine[0].id
    view.rebuild()
    node = next(it.data(0, Qt.ItemDataRole.UserRole) for it in view.items()
                if it.data(0, Qt.ItemDataRole.UserRole).message_ids == [other[0].id])  # its own row
    view.open_node(node)  # as a click on its row does: the other branch shown, its first token selected
    now = window.library.current.path()
    assert [m.id for m in now].index(other[0].id) == 7 and now[-1].id == other[-1].id  # the window's own copies
    page = _page(chat)
    assert chat.widget_for(other[0].id) is not None and page == now[0:PAGE]  # a page around it, from the top
    assert window.selection.message_id == other[0].id
    assert chat.later_button.isVisible() and chat.later_count == len(now) - PAGE
    qtbot.wait(50)
    assert len(chat.findChildren(MessageWidget)) <= 2 * PAGE


def _turns_from(conv: Conversation, question: Message, tag: str) -> list[Message]:
    """An answer to `question` and 60 turns below it; returns [that answer, ..., the last answer]."""
    answer = conv.add_message(question, "assistant")
    conv.set_tokens(answer, [token(0, 40 + ord(tag), f"Way {tag}")], f"Way {tag}")  # a fork at the first token
    conv.update_message(answer, finish_reason="eos")
    return [answer, _turns(conv, answer, 60, tag)]
