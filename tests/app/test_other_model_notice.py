"""Tokens recorded with one model, continued on another: the window says so (issue 36, item 16, first half).

Real window on the mock model; the answer's record names another model (as a loom tree imported from
elsewhere does)."""

from __future__ import annotations

from qt_helpers import answered, run_task, send

from app.state.models.model_match import other_model_notice, same_model

OTHER = {"name": "OtherModel-7B", "spec": "org/other-7b", "architecture": "mistral", "backend": "torch"}


def _answer_from_another_model(qtbot, window):
    answer = send(qtbot, window, "hello there")
    conv = window.library.current
    conv.update_message(answer, model=dict(OTHER), finish_reason="length")
    return conv, answer


def test_continuing_another_models_answer_says_so(qtbot, window):
    conv, answer = _answer_from_another_model(qtbot, window)
    notices: list[str] = []
    window.controller.notice.connect(notices.append)
    run_task(qtbot, window.on_continue(answer))
    qtbot.waitUntil(lambda: answered(window), timeout=15000)
    assert len(notices) == 1 and "OtherModel-7B" in notices[0] and "token ids" in notices[0]
    assert "OtherModel-7B" in window.status.currentMessage()
    # Now the answer is the loaded model's: continuing again says nothing.
    conv.update_message(answer, finish_reason="length")
    run_task(qtbot, window.on_continue(answer))
    assert len(notices) == 1


def test_branching_and_loom_continuations_on_another_models_tokens_say_so(qtbot, window):
    conv, answer = _answer_from_another_model(qtbot, window)
    notices: list[str] = []
    window.controller.notice.connect(notices.append)
    token = conv.tokens(answer)[1]
    run_task(qtbot, window.on_branch(answer, 1, token.top_model[-1].token_id))
    assert len(notices) == 1 and "OtherModel-7B" in notices[0]
    run_task(qtbot, window.loom_view.continuations_at(answer, 1), timeout_ms=30000)
    assert "OtherModel-7B" in window.loom_view.status.text()


def test_what_counts_as_the_same_model():
    loaded = {"name": "SmolLM2-135M-Instruct", "spec": "default", "architecture": "llama"}
    assert same_model({"spec": "default", "name": "renamed"}, loaded)
    assert same_model({"name": "SmolLM2-135M-Instruct", "architecture": "llama", "spec": "/elsewhere.gguf"}, loaded)
    assert not same_model({"name": "SmolLM2-135M-Instruct", "architecture": "mistral"}, loaded)
    assert not same_model(OTHER, loaded)
    assert other_model_notice(None, loaded) is None and other_model_notice({}, loaded) is None
    assert other_model_notice(OTHER, loaded).startswith("these tokens were written by OtherModel-7B")
