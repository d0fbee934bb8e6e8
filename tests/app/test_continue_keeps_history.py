"""Continue never rewrites what later turns answered (issue 43, item 3).

The real window on the mock model. Chat ▸ Continue answer acts on the last answer of the branch on screen
only, and says so in its text and tip (greyed out, with the reason, when that answer ended by itself);
an earlier cut-off answer's own More button continues it as a new version, and the turns after the
original keep the text they answered.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.state.versions import elsewhere, later_count
from qt_helpers import answered, run_task


def send(qtbot, window, text: str):
    """Send `text` as Enter does and wait for its answer (one after another: each waits for its own)."""
    answer = run_task(qtbot, window.on_send(text))
    qtbot.waitUntil(lambda: answered(window), timeout=15000)
    return answer


@pytest.mark.slow
def test_continue_acts_on_the_last_answer_and_an_earlier_one_becomes_a_new_version(qtbot, window):
    window.settings.set_max_new_tokens(4)
    first = send(qtbot, window, "the cat")
    assert first.finish_reason == "length" and len(first.tokens) == 4
    send(qtbot, window, "the dog")
    last = send(qtbot, window, "the river")
    conv = window.library.current
    conv.update_message(last, finish_reason="stop")  # the last answer ended normally
    first_ids = [t.token_id for t in first.tokens]
    first_text = first.content
    later = [m.id for m in conv.path()[2:]]
    assert len(later) == 4 and later_count(conv, first) == 4

    # The menu item does not reach back to the earlier cut-off answer, even with one of its tokens selected.
    window.selection.set(first.id, 1)
    action = window.menu_actions.continue_answer
    assert not action.isEnabled()
    assert action.text() == "&Continue answer" and "ended by itself" in action.toolTip()
    assert window.on_continue() is None
    assert "ended by itself" in window.status.currentMessage()
    action.trigger()
    assert not window.controller.busy and len(first.tokens) == 4 and len(conv.messages) == 6

    # Its own More button: a new version holding the continued answer; the original and the later turns stay.
    widget = window.chat.chat_view.widget_for(first.id)
    assert "new version" in widget.continue_button.toolTip()
    qtbot.mouseClick(widget.continue_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(window) and conv.path()[1] is not first, timeout=15000)
    version = conv.path()[1]
    assert [m.id for m in conv.siblings(first)] == [first.id, version.id]
    assert [t.token_id for t in first.tokens] == first_ids and first.content == first_text  # untouched
    assert conv.active_child(first.id).id == later[0] and later_count(conv, first) == 4
    assert [m.id for m in conv.ancestry(conv.messages[later[-1]])][1] == first.id  # they still build on it
    tokens = conv.tokens(version)
    assert len(tokens) > 4 and [t.token_id for t in tokens[:4]] == first_ids
    assert [t.index for t in tokens] == list(range(len(tokens)))
    assert version.content.startswith(first_text) and len(conv.path()) == 2
    assert elsewhere(conv, version).text == "4 later messages are on version 1"
    # Written as such: a fresh read of the store has both versions, the original's 4 tokens unchanged.
    store = window.library.store
    assert [t.token_id for t in store.tokens(first.id)] == first_ids
    assert [t.token_id for t in store.tokens(version.id)] == [t.token_id for t in tokens]


def test_the_menu_names_the_last_answer_and_continues_it_in_place(qtbot, window):
    window.settings.set_max_new_tokens(4)
    send(qtbot, window, "the cat")
    answer = send(qtbot, window, "the dog")
    conv = window.library.current
    action = window.menu_actions.continue_answer
    assert answer.finish_reason == "length"
    assert action.isEnabled() and action.text() == "&Continue the last answer (4 tokens)"
    assert "cut off by the length limit after 4 tokens" in action.toolTip()
    action.trigger()
    qtbot.waitUntil(lambda: answered(window) and len(answer.tokens) > 4, timeout=15000)
    assert conv.path()[-1] is answer and len(conv.siblings(answer)) == 1  # the last answer: in place
    assert action.text() == f"&Continue the last answer ({len(answer.tokens)} tokens)" or not action.isEnabled()

    # A question after it: Continue has no answer to act on, and says so.
    window.settings.set_max_new_tokens(4)
    user = conv.add_message(answer, "user", "and then?")
    assert conv.path()[-1] is user
    assert not action.isEnabled() and "Send answers it" in action.toolTip()
