"""After a restart the window picks up where it was: the selected conversation can be renamed and deleted,
and the status bar counts its tokens (and keeps counting while an answer streams)."""

from __future__ import annotations

import re

from PySide6.QtWidgets import QAbstractItemView

from qt_helpers import answered, close_window, make_window, send


def _context_used(window) -> int | None:
    m = re.fullmatch(r"context ([\d,]+|—) / ([\d,?]+)", window.status.context_label.text())
    assert m, window.status.context_label.text()
    return None if m.group(1) == "—" else int(m.group(1).replace(",", ""))


def _send_and_wait(qtbot, window, text: str):
    """Send `text` into the open conversation and wait for its answer (which may follow earlier ones)."""
    conv = window.library.current
    before = len(conv.messages)
    window.on_send(text)
    qtbot.waitUntil(lambda: len(conv.messages) == before + 2 and answered(window), timeout=15000)
    return conv.path()[-1]


def _restart(qtbot, window, store, host):
    close_window(qtbot, window)
    return make_window(qtbot, store, host)


def test_after_a_restart_the_selected_conversation_can_be_renamed_and_deleted(qtbot, window, store, host):
    send(qtbot, window, "the cat")
    window.new_chat()
    send(qtbot, window, "the dog")
    selected = window.library.current.id

    window = _restart(qtbot, window, store, host)
    sidebar = window.sidebar
    qtbot.waitUntil(lambda: sidebar.list.count() == 2)
    assert window.library.current.id == selected
    assert sidebar.list.currentItem() is not None and sidebar.list.currentItem().text() == "the dog"
    assert sidebar.rename_button.isEnabled() and sidebar.delete_button.isEnabled()

    # And they work: rename the selected conversation, then delete it.
    sidebar.begin_rename()
    assert sidebar.list.state() == QAbstractItemView.State.EditingState
    sidebar.list.currentItem().setText("Dogs")
    qtbot.waitUntil(lambda: store.conversation(selected).title == "Dogs")
    window.delete_conversation(selected)
    qtbot.waitUntil(lambda: sidebar.list.count() == 1)
    assert sidebar.rename_button.isEnabled() and sidebar.delete_button.isEnabled()
    close_window(qtbot, window)


def test_status_bar_counts_the_selected_conversation_after_a_restart_and_while_streaming(qtbot, window, store, host):
    context = host.info.context_length
    assert window.status.context_label.text() == f"context 0 / {context:,}"  # an empty new chat
    first = send(qtbot, window, "the cat")
    first_used = first.stats["prompt_tokens"] + first.stats["generated_tokens"]
    assert _context_used(window) == first_used > 0

    # Restarted: the selected conversation's tokens, not 0.
    window = _restart(qtbot, window, store, host)
    assert _context_used(window) == first_used
    assert window.status.context_label.text().endswith(f"/ {context:,}")

    # While an answer streams, the count follows every batch of tokens as it arrives.
    conv = window.library.current
    tokenizer = host.engine.tokenizer
    seen: list[tuple[int, int | None]] = []

    def on_tokens(message, _start):
        print("LABEL", window.status.context_label.text()); seen.append((len(conv.tokens(message)), _context_used(window)))

    conv.tokens_appended.connect(on_tokens)  # after the status bar's own handler
    answer = _send_and_wait(qtbot, window, "the dog")
    question = conv.messages[answer.parent_id]
    prompt = len(tokenizer.chat_ids(conv.history(question), add_generation_prompt=True))
    assert len(seen) >= 2, "the answer arrived in one batch; the test could not watch it stream"
    for n_tokens, used in seen:
        assert used == prompt + n_tokens
    assert [u for _, u in seen] == sorted(u for _, u in seen) and seen[-1][1] > seen[0][1]
    # Finished: what the engine counted for the run.
    assert _context_used(window) == answer.stats["prompt_tokens"] + answer.stats["generated_tokens"] == prompt + len(answer.tokens)

    # Switching conversations switches the count.
    window.new_chat()
    assert _context_used(window) == 0
    window.library.open(conv.id)
    assert _context_used(window) == prompt + len(answer.tokens)
    close_window(qtbot, window)


def test_after_a_restart_use_last_fixes_the_open_conversations_latest_seed(qtbot, window, store, host):
    first = _send_and_wait(qtbot, window, "the cat")
    cat_id, cat_seed = window.library.current.id, first.stats["seed"]
    window.new_chat()
    dog_seed = _send_and_wait(qtbot, window, "the dog").stats["seed"]
    assert cat_seed != dog_seed  # random seeds per answer

    window = _restart(qtbot, window, store, host)
    panel = window.sampling
    assert panel.last_seed_button.isEnabled()  # the open conversation's answer has a saved seed
    panel.last_seed_button.click()
    assert window.settings.options.sampler.seed == dog_seed

    window.library.open(cat_id)  # another conversation: its own latest answer's seed
    panel.last_seed_button.click()
    assert window.settings.options.sampler.seed == cat_seed
    close_window(qtbot, window)
