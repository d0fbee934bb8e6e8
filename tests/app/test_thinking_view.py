"""An answer's reasoning (`<think>…</think>`) shows as a collapsible Thinking block whose tokens still open
the inspector, and it stays out of the next turn's prompt. The answers are token records made here (the
mock model does not reason); the next turn runs on the mock model through the window."""

from __future__ import annotations


from PySide6.QtCore import Qt

from engine import TokenEvent, TokenProb, reasoning

from qt_helpers import run_task

PIECES = ["<think>", "\n", "Let", " me", " think", "\n", "</think>", "\n\n", "Hello", " there", "."]
THOUGHT = "Let me think"


def _events(pieces: list[str], first: int = 0) -> list[TokenEvent]:
    out = []
    for i, piece in enumerate(pieces, start=first):
        alts = (TokenProb(i + 1, piece, -0.2, None), TokenProb(999, " other", -1.9, None))
        out.append(TokenEvent(index=i, token_id=i + 1, text=piece, token_text=piece, logprob=-0.2,
                              sampler_logprob=-0.1, rank=0, entropy=0.7, top_model=alts, top_sampler=alts))
    return out


def _answer(window, pieces: list[str] = PIECES, *, generating: bool = False):
    conv = window.library.current
    user = conv.add_message(None, "user", "say hello")
    answer = conv.add_message(user, "assistant")
    if generating:
        conv.set_generating(answer, True)
        return conv, answer
    conv.set_tokens(answer, _events(pieces), "".join(pieces))
    conv.update_message(answer, finish_reason="eos")
    return conv, answer


def _widget(qtbot, window, answer):
    widget = window.chat.chat_view.widget_for(answer.id)
    qtbot.waitUntil(lambda: widget.isVisible() and widget.width() > 300, timeout=5000)
    return widget


def test_the_reasoning_is_a_collapsed_block_and_the_answer_is_the_rest(qtbot, window):
    conv, answer = _answer(window)
    widget = _widget(qtbot, window, answer)
    thinking = widget.thinking
    assert thinking.isVisible() and not thinking.expanded and not thinking.body.isVisible()
    assert widget.body.rendered_text == "Hello there." and thinking.body.rendered_text == THOUGHT
    assert "Thinking" in thinking.toggle.text() and "7 tokens" in thinking.toggle.text()
    assert "think" not in widget.body.document().toPlainText()
    qtbot.mouseClick(thinking.toggle, Qt.MouseButton.LeftButton)
    assert thinking.expanded and thinking.body.isVisible()
    assert THOUGHT in thinking.body.document().toPlainText()
    widget.copy_button.click()
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == "Hello there."  # Copy copies the answer, not the thoughts


def test_the_blocks_tokens_open_the_inspector_with_the_answers_own_indices(qtbot, window):
    conv, answer = _answer(window)
    window.view_options.set_heatmap(True)
    widget = _widget(qtbot, window, answer)
    thinking = widget.thinking
    assert thinking.body.mode == "tokens" and thinking.body.rendered_tokens == 7  # <think> … </think>
    assert widget.body.rendered_tokens == len(PIECES) - 7
    thinking.set_expanded(True)
    qtbot.waitUntil(lambda: thinking.body.isVisible() and thinking.body.width() > 100, timeout=3000)
    qtbot.mouseClick(thinking.body.viewport(), Qt.MouseButton.LeftButton, pos=thinking.body.token_rect(2))
    assert (window.selection.message_id, window.selection.index) == (answer.id, 2)
    assert "Let" in window.inspector.token_label.text()
    qtbot.mouseClick(widget.body.viewport(), Qt.MouseButton.LeftButton, pos=widget.body.token_rect(0))
    assert window.selection.index == 7  # the body's first token is the answer's 8th
    assert not thinking.body.extraSelections() and widget.body.extraSelections()
    # Selecting a token of a collapsed block opens it and highlights the token there.
    thinking.set_expanded(False)
    window.selection.set(answer.id, 4)
    assert thinking.expanded and thinking.body.extraSelections() and not widget.body.extraSelections()
    assert thinking.body.extraSelections()[0].cursor.selectionStart() == thinking.body.token_span(4)[0]


def test_a_streaming_answer_thinks_first_and_answers_after(qtbot, window):
    for heatmap in (False, True):
        window.view_options.set_heatmap(heatmap)
        conv, answer = _answer(window, generating=True)
        widget = _widget(qtbot, window, answer)
        for i, ev in enumerate(_events(PIECES)):
            conv.append_tokens(answer, [ev])
            if i == 0:  # "<think>" alone: a block, nothing in the body
                assert widget.thinking.isVisible() and widget.body.rendered_tokens == 0
            if i == 4:  # inside the reasoning: the block says so, the body is empty
                assert widget.thinking.isVisible() and "Thinking…" in widget.thinking.toggle.text()
                assert widget.body.rendered_tokens == 0 and not widget.body.rendered_text
        conv.set_generating(answer, False)
        shown = widget.body.rendered_tokens if heatmap else widget.body.rendered_text
        assert shown == (4 if heatmap else "Hello there."), heatmap
        assert "Thinking…" not in widget.thinking.toggle.text() and "7 tokens" in widget.thinking.toggle.text()


def test_an_answer_without_reasoning_has_no_block(qtbot, window):
    conv, answer = _answer(window, ["Close", " with", " </think>", " after", " <think>", "."])
    widget = _widget(qtbot, window, answer)
    assert not widget.thinking.isVisible() and widget.body.rendered_text == "Close with </think> after <think>."


def _spy_on_requests(monkeypatch, engine) -> list:
    """The requests the loaded engine is given from now on."""
    requests: list = []
    submit = engine.submit

    def spy(request, on_event, **kwargs):
        requests.append(request)
        return submit(request, on_event, **kwargs)

    monkeypatch.setattr(engine, "submit", spy)
    return requests


def test_the_next_turns_prompt_leaves_the_earlier_reasoning_out(qtbot, window, monkeypatch):
    conv, answer = _answer(window, ["<think>", " secret", " plan", "</think>", "The", " answer", "."])
    requests = _spy_on_requests(monkeypatch, window.host.engine)
    run_task(qtbot, window.controller.send("the cat"))
    (request,) = requests
    earlier = [m["content"] for m in request.messages if m["role"] == "assistant"]
    assert earlier == ["The answer."]  # the mock's plain transcript keeps everything: the app cut it
    new = conv.path()[-1]
    fmt = reasoning.ReasoningFormat.from_dict(new.request["reasoning"])  # saved for the answer's view
    assert fmt.markers[0] == reasoning.THINK and not fmt.template_drops
