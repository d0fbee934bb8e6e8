"""A server that fails a few tokens into an answer: the window keeps the text so far and says why (issue 20 item 16).

The server is a scripted OpenAI-compatible one on 127.0.0.1 (tests/remote_server.py); the window talks to it
through the real remote backend.
"""

from __future__ import annotations

import pytest

from qt_helpers import answered, close_window, make_window, mock_factory, run_task
from remote_server import CharModel, FakeServer, Reply

from app.controllers.engine_host import EngineHost

STEPS_BEFORE_FAILING = 4


class FailsMidAnswer:
    """CharModel's answers, until the answer has grown by `STEPS_BEFORE_FAILING` tokens: then a 500."""

    def __init__(self) -> None:
        self.model = CharModel({"a": 0.6, "b": 0.3, "c": 0.1})
        self.first_prompt: int | None = None

    def __call__(self, method: str, path: str, body) -> Reply:
        if path == "/v1/completions" and isinstance(body, dict) and body.get("max_tokens") == 1:
            prompt = body.get("prompt", "")
            if len(prompt) > 20:  # the probe's prompts are short; this is the answer's first step
                self.first_prompt = self.first_prompt or len(prompt)
                if len(prompt) >= self.first_prompt + STEPS_BEFORE_FAILING:
                    return Reply({"error": {"message": "the GPU fell off the bus"}}, 500)
        return self.model(method, path, body)


@pytest.fixture
def server():
    s = FakeServer(FailsMidAnswer())
    yield s
    s.close()


@pytest.mark.slow
def test_a_server_failing_mid_answer_keeps_the_text_and_tells_the_user(qtbot, qloop, store, server):
    host = EngineHost(mock_factory())
    assert run_task(qtbot, host.load(server.url, "remote"), timeout_ms=30000)
    window = make_window(qtbot, store, host, max_new_tokens=12)
    try:
        errors: list[str] = []
        window.controller.error.connect(errors.append)
        window.on_send("Tell me a story about the sea, please")
        qtbot.waitUntil(lambda: answered(window), timeout=30000)
        answer = window.library.current.path()[-1]
        assert answer.finish_reason == "error"
        # The text so far, kept: one character per token of what the server offered.
        assert len(answer.content) == STEPS_BEFORE_FAILING and set(answer.content) <= set("abc")
        assert len(errors) == 1, errors
        assert f"stopped after {STEPS_BEFORE_FAILING} tokens" in errors[0] and "GPU fell off the bus" in errors[0]
    finally:
        close_window(qtbot, window)
        host.close()
