"""An imported loom tree's earlier answers (text, no token records) show their text in the token view
(issue 37 item 9); before, the token view drew their (missing) tokens: an empty message."""

from __future__ import annotations

from qt_helpers import answered, send


def test_earlier_answers_of_an_imported_tree_show_their_text_in_the_token_view(qtbot, window, tmp_path):
    first = send(qtbot, window, "hello there")
    earlier_text = first.content
    assert earlier_text.strip()
    send(qtbot, window, "and again")
    # The second send starts after a turn of the loop: wait for its answer, not the first one.
    qtbot.waitUntil(lambda: len(window.library.current.path()) == 4 and answered(window), timeout=15000)
    second = window.library.current.path()[-1]
    window.selection.set(second.id, 0)  # the loom exports the group of the answer in view
    path = tmp_path / "tree.json"
    window.loom_view.export_to(path)
    window.loom_view.import_from(path)

    conv = window.library.current
    earlier = conv.path()[1]
    assert earlier.is_assistant and earlier.content == earlier_text and not conv.tokens(earlier)
    window.view_options.set_heatmap(True)
    chat = window.chat.chat_view
    body = chat.widget_for(earlier.id).body
    # The words, whatever the line breaks (the mock's random text may hold a newline, which the text body lays
    # out as a paragraph and gives back as a space).
    assert body.visible_text().split() == earlier_text.split()
    # The imported answers themselves have their tokens, and the token view shows them as tokens.
    last = conv.path()[-1]
    assert conv.tokens(last) and chat.widget_for(last.id).body.mode == "tokens"
