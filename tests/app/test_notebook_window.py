"""The notebook in the window, on the mock model (a model without a chat template, like a base model):
a base model opens a notebook, the text is continued with no template, its tokens are inspected and branched,
an edit keeps the old version, and the template dialog chooses a template that is remembered per model."""

from __future__ import annotations

import json

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QDialogButtonBox

from engine import TokenEvent
from engine.templates import choice as template_choice

from app.state.notebook import notebook_text
from app.actions.templates import TEMPLATES_KEY
from qt_helpers import close_window, make_window, run_task

PROMPT = " the quick brown fox"


def _inside(editor, position: int, share: float) -> QPoint:
    """A viewport point `share` of the way across the character at document `position` (0.5: its middle)."""
    cursor = QTextCursor(editor.document())
    cursor.setPosition(position)
    left = editor.cursorRect(cursor)
    cursor.setPosition(position + 1)
    right = editor.cursorRect(cursor)
    return QPoint(round(left.left() + share * (right.left() - left.left())), left.center().y())


def _generate(qtbot, w, text: str):
    w.notebook.editor.setPlainText(text)
    qtbot.mouseClick(w.notebook.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.controller.busy, timeout=5000)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=15000)
    return w.library.current.path()[-1]


def test_a_base_model_opens_a_notebook_that_is_continued_without_a_template(qtbot, qloop, store, host):
    w = make_window(qtbot, store, host)
    try:
        assert w.library.current.mode == "chat" and w.chat.isVisible()
        assert run_task(qtbot, w.start("mock", "mock"))
        conv = w.library.current  # the mock model has no chat template: the empty chat became a notebook
        assert conv.mode == "notebook" and w.notebook.isVisible() and not w.chat.isVisible()
        assert w.status.template_label.text() == "Notebook · no template"

        part = _generate(qtbot, w, PROMPT)
        assert part.is_assistant and part.content and part.finish_reason in ("length", "stop")
        assert w.notebook.editor.toPlainText() == PROMPT + part.content == notebook_text(conv)
        # The model saw the raw text: the first cached tokens are the text's own, no "User:"/"Assistant:" around it.
        tok = host.engine.tokenizer
        backend = host.engine.wait_ready()
        assert backend.cached_tokens()[: len(tok.encode(PROMPT))] == tok.encode(PROMPT)
        assert len(tok.encode(PROMPT)) == part.stats["prompt_tokens"]
        assert "User" not in tok.decode(backend.cached_tokens())
    finally:
        close_window(qtbot, w)


def test_notebook_tokens_are_coloured_inspected_branched_and_an_edit_keeps_the_old_version(window, qtbot):
    w = window
    w.new_notebook()
    conv = w.library.current
    w.view_options.set_heatmap(True)
    part = _generate(qtbot, w, PROMPT)
    tokens = conv.tokens(part)
    assert len(w.notebook.editor.extraSelections()) == sum(1 for t in tokens if t.text)

    # A click on the third generated token selects it for the inspector. In the middle of its first character:
    # the caret's place after that character was the boundary with the next token when the mock drew a
    # one-character token there (".", ",", "é": about 1 answer in 200), and the click selected token 3.
    view = w.notebook
    position = view.token_position(part.id, 2)
    cursor = view.editor.textCursor()
    point = _inside(view.editor, position, 0.5)
    qtbot.mouseClick(view.editor.viewport(), Qt.MouseButton.LeftButton, pos=point)
    assert (w.selection.message_id, w.selection.index) == (part.id, 2)
    assert w.inspector.selected_event() is tokens[2]

    # Branch from an alternative of that token: a new version of the part, the text follows it.
    alternative = next(a.token_id for a in tokens[2].top_model if a.token_id != tokens[2].token_id)
    run_task(qtbot, w.on_branch(part, 2, alternative))
    branch = conv.path()[-1]
    assert branch is not part and branch.parent_id == part.parent_id and branch.branch_index == 2
    assert [t.token_id for t in conv.tokens(branch)[:3]] == [t.token_id for t in tokens[:2]] + [alternative]
    assert view.editor.toPlainText() == PROMPT + branch.content
    cursor.setPosition(len(PROMPT) + 1)
    view.editor.setTextCursor(cursor)
    assert view.next_button.isVisible() and "version 2 / 2" in view.version_label.text()

    # Edit inside the generated text, then leave the editor: a new version; the model's is one ‹ away.
    edited = PROMPT + " and the lazy dog"
    view.editor.setPlainText(edited)
    view.commit_draft()
    assert notebook_text(conv) == edited and conv.path()[-1].content == " and the lazy dog"
    cursor.setPosition(len(PROMPT) + 2)
    view.editor.setTextCursor(cursor)
    qtbot.mouseClick(view.previous_button, Qt.MouseButton.LeftButton)
    assert view.editor.toPlainText() == PROMPT + branch.content


def test_a_click_anywhere_on_a_tokens_characters_selects_that_token(window, qtbot):
    """The right half of a token's last character is still that token: the editor's nearest caret place there
    is the next token's start, which a click used to select (a one-character token could only be clicked on
    its left half)."""
    w = window
    w.new_notebook()
    conv = w.library.current
    prompt = conv.add_message(None, "user", PROMPT)
    part = conv.add_message(prompt, "assistant")
    pieces = (" cat", ".", " dog")
    events = [TokenEvent(index=i, token_id=10 + i, text=p, token_text=p, logprob=-0.5, sampler_logprob=-0.5, rank=0,
                         entropy=1.0, top_model=(), top_sampler=()) for i, p in enumerate(pieces)]
    conv.set_tokens(part, events, "".join(pieces))
    conv.update_message(part, finish_reason="length")
    conv.flush()
    view = w.notebook
    qtbot.waitUntil(lambda: view.editor.toPlainText() == PROMPT + "".join(pieces), timeout=5000)
    dot, cat_end = view.token_position(part.id, 1), view.token_position(part.id, 1) - 1
    for position, share, index in ((dot, 0.25, 1), (dot, 0.75, 1), (cat_end, 0.75, 0), (dot + 1, 0.25, 2)):
        w.selection.clear()
        qtbot.mouseClick(view.editor.viewport(), Qt.MouseButton.LeftButton, pos=_inside(view.editor, position, share))
        assert (w.selection.message_id, w.selection.index) == (part.id, index), (position, share)


def test_a_notebook_survives_a_restart_and_exports_as_text(window, qtbot, store, host, tmp_path):
    window.new_notebook()
    part = _generate(qtbot, window, PROMPT)
    conv_id = window.library.current.id
    path = window.export("markdown", tmp_path / "notebook.md")
    assert path is not None and (PROMPT + part.content).strip() in path.read_text(encoding="utf-8")
    close_window(qtbot, window)

    again = make_window(qtbot, store, host)
    try:
        assert again.library.current.id == conv_id and again.notebook.isVisible()
        assert again.notebook.editor.toPlainText() == PROMPT + part.content
        assert again.library.current.tokens(again.library.current.path()[-1])  # the token records are back
        doc = json.loads(again.export("json", tmp_path / "notebook.json").read_text(encoding="utf-8"))
        assert doc["mode"] == "notebook"
    finally:
        close_window(qtbot, again)


def test_a_chat_with_a_base_model_warns_and_a_chosen_template_is_used_and_remembered(window, qtbot, store, host):
    w = window
    w.new_chat()
    assert w.library.current.mode == "chat"
    assert w.status.template_label.text() == "⚠ No chat template"
    assert "no chat template" in w.status.template_label.toolTip()

    w.menu_actions.chat_template.trigger()
    dialog = w.templates.dialog
    dialog.choice_box.setCurrentIndex(dialog.choice_box.findData("chatml"))
    assert "<|im_start|>assistant" in dialog.preview.toPlainText()
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    tok = host.engine.tokenizer
    assert tok.template_override == template_choice.BUILTIN_TEMPLATES["chatml"].text
    assert w.status.template_label.text() == "Template: ChatML (built-in)"
    assert store.get_setting(TEMPLATES_KEY) == {host.info.spec or host.info.path or host.info.name: "chatml"}

    # A pasted template that is not Jinja cannot be chosen: the dialog says why and OK stays off.
    w.menu_actions.chat_template.trigger()
    dialog = w.templates.dialog
    dialog.choice_box.setCurrentIndex(dialog.choice_box.findData("__custom__"))
    dialog.text_edit.setPlainText("{% for m in messages %}")
    assert "not valid Jinja" in dialog.error_label.text()
    assert not dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    dialog.reject()

    # The model loads again (another session): the remembered template is applied.
    tok.template_override = None
    host.model_changed.emit(host.info)
    assert tok.template_override == template_choice.BUILTIN_TEMPLATES["chatml"].text
