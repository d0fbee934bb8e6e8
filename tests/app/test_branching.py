"""Branching from an alternative token in the inspector, and switching between sibling answers."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.state.database.store import Store
from qt_helpers import answered, send


def test_branch_from_an_alternative_then_switch_siblings(qtbot, window, db_path):
    window.settings.update_sampler(seed=11)
    original = send(qtbot, window, "the cat")
    conv = window.library.current
    tokens = list(conv.tokens(original))
    assert len(tokens) > 6

    # Token view on, click token 4 in the answer: the inspector shows it.
    qtbot.keyClick(window, Qt.Key.Key_H, Qt.KeyboardModifier.ControlModifier)
    assert window.view_options.heatmap
    body = window.chat.chat_view.widget_for(original.id).body
    assert body.mode == "tokens" and body.rendered_tokens == len(tokens)
    index = 4
    qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=body.token_rect(index))
    assert (window.selection.message_id, window.selection.index) == (original.id, index)
    inspector = window.inspector
    chosen = tokens[index]
    assert inspector.table.selected_token() == chosen.token_id  # the chosen row is preselected
    assert inspector.table.topLevelItemCount() >= len(chosen.top_model)
    assert inspector.stages.table.columnCount() == 2 + len(chosen.stages)  # token, model, one per stage

    # Pick an alternative the sampler did not choose, and branch with it.
    alt = next(p for p in chosen.top_model if p.token_id != chosen.token_id)
    assert inspector.table.select_token(alt.token_id)
    assert inspector.branch_button.isEnabled() and "Branch with" in inspector.branch_button.text()
    qtbot.mouseClick(inspector.branch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(window) and conv.path()[-1] is not original, timeout=10000)

    branch = conv.path()[-1]
    btokens = conv.tokens(branch)
    assert branch.parent_id == original.parent_id and branch.branch_index == index
    assert [t.token_id for t in btokens[:index]] == [t.token_id for t in tokens[:index]]
    assert btokens[index].token_id == alt.token_id and btokens[index].forced
    assert [t.index for t in btokens] == list(range(len(btokens)))
    assert branch.content == "".join(t.text for t in btokens)
    # The engine reused the KV cache of the shared prefix instead of recomputing it.
    assert branch.stats["reused_tokens"] >= branch.stats["prompt_tokens"] - 1
    # The inspector followed the branch to its forced token, and only that token is highlighted.
    assert (window.selection.message_id, window.selection.index) == (branch.id, index)
    assert "forced" in inspector.token_label.text()
    assert f"of {len(btokens)}" in inspector.token_label.text()
    bbody = window.chat.chat_view.widget_for(branch.id).body
    (highlight,) = bbody.extraSelections()
    assert (highlight.cursor.selectionStart(), highlight.cursor.selectionEnd()) == bbody.token_span(index)

    view = window.chat.chat_view
    w = view.widget_for(branch.id)
    assert w.sibling_label.text() == "2 / 2" and "branched at token 5" in w.footer.text()
    qtbot.mouseClick(w.prev_button, Qt.MouseButton.LeftButton)
    assert conv.path()[-1] is original
    assert view.widget_for(original.id).sibling_label.text() == "1 / 2"
    assert view.widget_for(branch.id) is None
    assert window.selection.message_id is None  # the selected token's branch is no longer shown
    qtbot.mouseClick(view.widget_for(original.id).next_button, Qt.MouseButton.LeftButton)
    assert conv.path()[-1] is branch

    # The stage records the streaming flushes left out are written in slices after the answer (issue 47): on a
    # loaded machine they can still be due here, and a second connection reads the rows as they are.
    qtbot.waitUntil(lambda: not conv.has_due_stages, timeout=10000)
    fresh = Store(db_path)
    try:
        rows = {r.id: r for r in fresh.messages(conv.id)}
        assert rows[original.parent_id].active_child_id == branch.id
        assert rows[branch.id].branch_index == index
        assert fresh.tokens(branch.id) == btokens
    finally:
        fresh.close()
