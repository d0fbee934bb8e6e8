"""Loom ▸ Continue ×N with a tree row selected: the token clicked in the chat wins; without one, the N
children are alternatives to the row's node, starting where it starts (issue 37 item 5).

Before, a selected row always sent the run to the node's end: past a finished answer's end of text that is
"the answer ends there (end of text)", and the token the user had just clicked was ignored.
"""

from __future__ import annotations

from PySide6.QtCore import Qt

from qt_helpers import send


def _row(view, pick):
    return next(it for it in view.items() if pick(it.data(0, Qt.ItemDataRole.UserRole)))


def _run(qtbot, window, answer) -> list:
    conv = window.library.current
    before = {m.id for m in conv.children(answer.parent_id)}
    window.loom_view.continue_button.click()
    qtbot.waitUntil(lambda: len(conv.children(answer.parent_id)) == len(before) + 2 and not window.loom.busy,
                    timeout=15000)
    assert "ends there" not in window.loom_view.status.text()
    return [m for m in conv.children(answer.parent_id) if m.id not in before]


def test_continue_from_a_selected_row_starts_at_the_clicked_token_else_at_the_row(qtbot, window):
    answer = send(qtbot, window, "hello there")
    view = window.loom_view
    view.n_spin.setValue(2)
    view.tokens_spin.setValue(3)
    view.rebuild()

    # A row selected in the tree (the whole answer, whose end is the end of the answer), then a token clicked.
    leaf = _row(view, lambda n: n is not None and n.tokens and answer.id in n.message_ids and not n.children)
    view.tree.setCurrentItem(leaf)
    window.selection.set(answer.id, 2)
    children = _run(qtbot, window, answer)
    assert [c.branch_index for c in children] == [2, 2]

    # No token chosen: N alternatives to the selected node (one below the first fork), from where it starts.
    view.rebuild()
    node_row = _row(view, lambda n: n is not None and n.tokens and n.start >= 2)
    node = node_row.data(0, Qt.ItemDataRole.UserRole)
    window.selection.clear()
    view.tree.setCurrentItem(node_row)
    more = _run(qtbot, window, answer)
    assert [c.branch_index for c in more] == [node.start, node.start]
    conv = window.library.current
    kept = [t.token_id for t in conv.tokens(conv.messages[node.message_ids[0]])[: node.start]]
    assert all([t.token_id for t in conv.tokens(c)[: node.start]] == kept for c in more)
