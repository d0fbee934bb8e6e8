"""Helpers for driving the window in tests (imported by the tests and conftest)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from PySide6.QtCore import Qt

from engine import Engine
from engine.backends.mock import MockBackend

from app.controllers.engine_host import EngineHost
from app.state.database.store import Store

MOCK_DELAY_S = 0.01  # per token: slow enough to stop mid-answer, fast enough for a quick suite


def mock_factory(delay_s: float = MOCK_DELAY_S) -> Callable:
    """Engines for tests: "mock" (or None) is the deterministic mock model; anything else loads for real."""

    def factory(spec, backend, progress):
        if spec in (None, "mock"):
            progress("loading the mock model", 1.0)
            return Engine.from_backend(MockBackend(delay_s=delay_s))
        return Engine.start(spec, backend=backend, progress=progress)

    return factory


def run_task(qtbot, awaitable, timeout_ms: int = 15000):
    """Run a coroutine or task on the qasync loop until done, spinning Qt; return its result."""
    task = asyncio.ensure_future(awaitable)
    qtbot.waitUntil(task.done, timeout=timeout_ms)
    return task.result()


def make_window(qtbot, store: Store, host: EngineHost, max_new_tokens: int = 24):
    from app.main_window import DEFAULT_SIZE, MainWindow

    window = MainWindow(store, host)
    # The default size whatever the test platform's screen (offscreen: 800x800, which a first start fits
    # itself to), so what the tests click and hover lies where they expect it.
    window.size_to_fit(*DEFAULT_SIZE)
    window.settings.set_max_new_tokens(max_new_tokens)
    window.show()
    qtbot.waitExposed(window)
    return window


def close_window(qtbot, window) -> None:
    window.close()
    qtbot.waitUntil(lambda: window._shutdown_done, timeout=10000)
    window.deleteLater()


def answered(window) -> bool:
    """The open conversation ends with a finished answer and nothing is generating."""
    conv = window.library.current
    path = conv.path() if conv else []
    return bool(path) and path[-1].is_assistant and not path[-1].generating and not window.controller.busy


def send(qtbot, window, text: str, timeout_ms: int = 15000):
    """Type `text`, press Enter, wait for the answer; returns the answer message."""
    edit = window.chat.composer.edit
    edit.setFocus()
    edit.setPlainText(text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.controller.busy or answered(window), timeout=timeout_ms)
    qtbot.waitUntil(lambda: answered(window), timeout=timeout_ms)
    return window.library.current.path()[-1]
