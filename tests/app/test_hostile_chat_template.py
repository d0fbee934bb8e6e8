"""A model whose chat template loops for hours cannot freeze the window: the template renders off the
UI thread (status bar count, send), within the engine's time limit, and its failure is said in words."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer

from qt_helpers import answered, close_window, make_window, run_task

pytest.importorskip("llama_cpp")
sys.path.insert(0, str(Path(__file__).parents[1]))
from tiny_gguf import CHAT_TEMPLATE, write_tiny_llama_gguf  # noqa: E402

# Ten billion empty iterations, then an honest ChatML prompt.
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + CHAT_TEMPLATE
LIMIT_S = 2.0


class Ticks:
    """Counts event-loop ticks (a 10 ms timer): a frozen window counts none."""

    def __init__(self) -> None:
        self.count = 0
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    def _tick(self) -> None:
        self.count += 1


@pytest.fixture
def hostile_window(qtbot, qloop, store, host, tmp_path, monkeypatch):
    import engine.templates.render as chat_template

    monkeypatch.setattr(chat_template, "TIME_LIMIT_S", LIMIT_S)
    path = write_tiny_llama_gguf(tmp_path / "hostile.gguf", chat_template=NESTED_LOOPS)
    assert run_task(qtbot, host.load(str(path), "llamacpp"), timeout_ms=60000)
    window = make_window(qtbot, store, host, max_new_tokens=4)
    yield window
    if not window._shutdown_done:
        close_window(qtbot, window)


@pytest.mark.slow
def test_the_context_counter_never_renders_the_template_on_the_ui_thread(qtbot, hostile_window):
    window = hostile_window
    conv = window.library.current
    ticks = Ticks()
    t0 = time.monotonic()
    conv.add_message(None, "user", "hi")  # the status bar counts the new prompt
    assert time.monotonic() - t0 < 1.0, "the window stopped while the chat template rendered"
    qtbot.wait(int(LIMIT_S * 1000 / 2))
    assert ticks.count >= 10, f"{ticks.count} event-loop ticks while the template rendered"
    # The count fails at the engine's limit, and the status bar says why.
    label = window.status.context_label
    qtbot.waitUntil(lambda: label.text().startswith("context ?"), timeout=int(LIMIT_S * 1000 * 4))
    assert "did not finish" in label.toolTip() and "chat template" in label.toolTip()


@pytest.mark.slow
def test_sending_with_a_hostile_template_keeps_the_window_alive_and_says_why(qtbot, hostile_window):
    window = hostile_window
    errors: list[str] = []
    window.controller.error.connect(errors.append)
    ticks = Ticks()
    t0 = time.monotonic()
    window.on_send("hi")
    assert time.monotonic() - t0 < 1.0
    qtbot.wait(int(LIMIT_S * 1000 / 2))
    assert ticks.count >= 10, f"{ticks.count} event-loop ticks while the template rendered"
    qtbot.waitUntil(lambda: answered(window), timeout=int(LIMIT_S * 1000 * 6))
    answer = window.library.current.path()[-1]
    assert answer.finish_reason == "error"
    assert any("chat template" in e and "did not finish" in e for e in errors), errors
    # Close still works, promptly.
    t0 = time.monotonic()
    close_window(qtbot, window)
    assert time.monotonic() - t0 < LIMIT_S * 3
