"""Compare models: loading model B shows its progress and can be cancelled (issue 43, item 5).

The real Compare-models window; model B's load is a real engine worker whose loader reports progress like a
download does (a fraction per chunk) and takes seconds. The window shows a determinate bar and what the load
does, counts the seconds, and Cancel stops the load on its worker (no further chunk is fetched) and leaves
no model B behind.
"""

from __future__ import annotations

import threading
import time

import pytest

from engine import Engine
from engine.backends.mock import MockBackend
from engine.worker import ModelWorker

from app.controllers.model_diff import SecondModel
from app.widgets.experiment_windows.model_diff_view import ModelDiffView

CHUNKS = 100  # a "download" of 100 chunks, 50 ms each: 5 s unless cancelled


class SlowLoads:
    """A factory whose loads report progress per chunk, as a download does; records how far each got."""

    def __init__(self) -> None:
        self.chunks = 0
        self.lock = threading.Lock()
        self.ended = threading.Event()  # a load's loop ended (finished or raised)

    def __call__(self, spec, backend, progress):
        def load():
            try:
                for i in range(CHUNKS):
                    progress(f"downloading {spec}", i / CHUNKS)
                    with self.lock:
                        self.chunks += 1
                    time.sleep(0.05)
            finally:
                self.ended.set()
            return MockBackend()

        return Engine(ModelWorker(load))


@pytest.mark.slow
def test_loading_model_b_shows_progress_and_cancel_stops_it(qtbot, qloop, host):
    loads = SlowLoads()
    view = ModelDiffView(host, recent=[], second=SecondModel(loads))
    qtbot.addWidget(view)
    view.show()
    task = view.load_second("slow-b", "mock")
    qtbot.waitUntil(lambda: view.load_bar.isVisible() and view.load_bar.value() >= 5, timeout=5_000)
    assert view.load_bar.maximum() == 100  # determinate: the load says how far it is
    assert view.cancel_load_button.isVisible() and not view.load_button.isEnabled()
    words = view.models_label.text()
    assert "B: loading slow-b (mock)…" in words and "downloading slow-b" in words and " %" in words
    qtbot.waitUntil(lambda: " 1 s" in view.models_label.text() or " 2 s" in view.models_label.text(), timeout=4_000)

    view.cancel_load_button.click()
    assert loads.ended.wait(2.0)  # the worker's load stopped at its next progress report
    stopped_at = loads.chunks
    assert stopped_at < CHUNKS
    qtbot.waitUntil(task.done, timeout=5_000)
    qtbot.wait(300)
    assert loads.chunks == stopped_at and view.second.engine is None and not view.second.loading
    assert not view.load_bar.isVisible() and not view.cancel_load_button.isVisible()
    assert "loading slow-b was cancelled" in view.models_label.text() and view.load_button.isEnabled()
    view.close()
