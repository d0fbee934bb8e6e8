"""The view keeps its place while the loom runs (issue 43 item 6).

Loom ▸ Continue ×N on an answer followed by later turns: each new child was made the shown answer for a
moment, the inspector let go of the selected token (its answer had left the screen), and the Loom panel
switched to the group of the conversation's last answer. Auto-expand showed each child it continued, and
left the chat on another version (7/21) than the one the user looked at.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from qt_helpers import answered, send


def _node(item):
    return item.data(0, Qt.ItemDataRole.UserRole)


def test_continue_keeps_the_selected_answer_while_children_arrive(qtbot, window):
    first = send(qtbot, window, "hello there")
    conv = window.library.current
    window.on_send("and then?")  # a later turn: the last answer on screen is another group's
    qtbot.waitUntil(lambda: len(conv.messages) == 4 and answered(window), timeout=15000)
    later = conv.path()[-1]
    view = window.loom_view
    window.loom_dock.raise_()
    window.selection.set(first.id, 2)  # a token of the first answer, clicked in the chat
    view.rebuild()
    assert view.tree.topLevelItem(0).data(0, Qt.ItemDataRole.UserRole).message_ids == [first.id]
    view.n_spin.setValue(3)
    view.tokens_spin.setValue(6)
    seen: list[tuple[int, ...]] = []  # the group of every tree the panel drew during the run
    draw = view._draw
    view._draw = lambda root, answers, keep: (seen.append(tuple(root.message_ids)), draw(root, answers, keep))
    before = len(view._tasks)
    view.continue_button.click()
    assert len(view._tasks) == before + 1
    task = next(iter(view._tasks))
    qtbot.waitUntil(task.done, timeout=15000)
    qtbot.waitUntil(lambda: not view._rebuild_timer.isActive() and not view.building, timeout=5000)
    group = [m.id for m in conv.children(first.parent_id)]
    assert len(group) == 4, view.status.text()
    assert all(later.id not in ids for ids in seen), "the panel switched to the later answer's group"
    assert tuple(_node(view.tree.topLevelItem(0)).message_ids) == tuple(group)
    assert (window.selection.message_id, window.selection.index) == (first.id, 2)  # still the token clicked
    assert conv.path()[1] is first and conv.path()[-1] is later  # the chat still shows what it showed


def test_auto_expand_keeps_the_version_the_user_looks_at(qtbot, window):
    answer = send(qtbot, window, "hello there")
    conv = window.library.current
    view = window.loom_view
    window.loom_dock.raise_()
    window.selection.set(answer.id, 0)
    view.entropy_spin.setValue(0.0)  # every token is a fork: the run continues children, and theirs
    view.min_p_spin.setValue(0.0)
    view.depth_spin.setValue(3)
    view.n_spin.setValue(2)
    view.tokens_spin.setValue(3)
    view.budget_spin.setValue(40)
    task = view._on_expand_clicked()
    qtbot.waitUntil(task.done, timeout=30000)
    made = [m for m in conv.children(answer.parent_id) if m is not answer]
    assert len(made) >= 4 and any(m.branch_index and m.branch_index > 0 for m in made)  # children of children too
    assert conv.path()[-1] is answer  # the version the user looked at, not the run's last child
    assert (window.selection.message_id, window.selection.index) == (answer.id, 0)


def test_outside_a_run_the_tree_follows_the_newest_answer(qtbot, window):
    first = send(qtbot, window, "hello there")
    conv = window.library.current
    view = window.loom_view
    view.rebuild()
    assert view.tree.topLevelItem(0).data(0, Qt.ItemDataRole.UserRole).message_ids == [first.id]
    window.on_send("and then?")
    qtbot.waitUntil(lambda: len(conv.messages) == 4 and answered(window), timeout=15000)
    later = conv.path()[-1]
    qtbot.waitUntil(lambda: not view._rebuild_timer.isActive() and not view.building, timeout=5000)
    view.rebuild()  # nothing selected, no run: the last answer on screen, as before
    assert view.tree.topLevelItem(0).data(0, Qt.ItemDataRole.UserRole).message_ids == [later.id]
