"""The conversation list: new, search (titles and message text), rename, delete."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from qt_helpers import send


def _titles(sidebar) -> list[str]:
    return [sidebar.list.item(i).text() for i in range(sidebar.list.count())]


@pytest.mark.slow
def test_new_search_rename_delete(qtbot, window):
    sidebar = window.sidebar
    send(qtbot, window, "the cat")
    first = window.library.current
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.library.current is not first
    answer = send(qtbot, window, "the dog")
    second = window.library.current
    qtbot.waitUntil(lambda: sorted(_titles(sidebar)) == ["the cat", "the dog"])
    assert sidebar.list.currentItem().text() == "the dog"

    # Search matches titles (a word no mock answer can contain) and the text of answers.
    window.library.rename(first.id, "Felines")
    qtbot.waitUntil(lambda: "Felines" in _titles(sidebar))
    qtbot.keyClicks(sidebar.search, "feline")
    qtbot.waitUntil(lambda: _titles(sidebar) == ["Felines"])
    sidebar.search.clear()
    word = answer.content.split()[0]
    qtbot.keyClicks(sidebar.search, word)
    qtbot.waitUntil(lambda: "the dog" in _titles(sidebar))
    sidebar.search.clear()
    qtbot.waitUntil(lambda: len(_titles(sidebar)) == 2)

    # Clicking a conversation opens it.
    item = next(sidebar.list.item(i) for i in range(2) if sidebar.list.item(i).text() == "Felines")
    sidebar.list.setCurrentItem(item)
    assert window.library.current is first
    assert window.chat.chat_view.message_widgets[0].message.content == "the cat"
    assert window.chat.title_label.text() == "Felines"

    window.delete_conversation(first.id)
    qtbot.waitUntil(lambda: _titles(sidebar) == ["the dog"])
    assert window.library.current.id == second.id
    assert window.store.conversation(first.id) is None
    assert window.store.messages(first.id) == []


def test_a_search_typed_as_the_window_closes_does_not_touch_the_closed_database(qtbot, window):
    """The search waits 150 ms for more typing; the window and then its database can close within them
    (seen in the test suite: a closed window's search fired after the store was closed)."""
    window.close()  # closed, not yet deleted: its widgets and their timers live on
    qtbot.waitUntil(lambda: window._shutdown_done, timeout=10000)
    qtbot.keyClicks(window.sidebar.search, "cats")  # typed as the window went
    assert window.sidebar._search_timer.isActive()
    window.store.close()  # what the app does once the window is gone
    with qtbot.captureExceptions() as exceptions:
        qtbot.wait(400)  # the timer fires here: before the fix, AttributeError on the closed connection
    assert not window.sidebar._search_timer.isActive(), "the search timer fired"
    assert exceptions == []
