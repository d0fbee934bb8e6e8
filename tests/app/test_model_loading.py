"""A model that fails to load leaves the previous one loaded and working; progress is shown while loading."""

from __future__ import annotations

from qt_helpers import run_task, send


def test_model_load_failure_keeps_the_old_model_working(qtbot, window, host, tmp_path):
    before = host.engine
    assert host.info.name == "mock"
    missing = tmp_path / "no-such-model"
    ok = run_task(qtbot, window.models.load(str(missing), "torch"))
    assert ok is False
    box = window.models.error_box
    assert box is not None and box.isVisible()
    assert "model not found" in box.text() and str(missing) in box.text()
    assert "mock, is still loaded" in box.text()
    assert host.engine is before and host.info.name == "mock" and not host.loading
    assert window.menu_actions.open_model.isEnabled()
    assert "mock" in window.status.model_label.text()
    box.close()

    answer = send(qtbot, window, "the cat")  # the old model still answers
    assert answer.finish_reason in ("eos", "length") and answer.tokens
    assert answer.model["name"] == "mock"


def test_loading_shows_progress_and_the_window_is_usable_meanwhile(qtbot, qloop, store):
    import threading

    from engine import Engine
    from engine.backends.mock import MockBackend

    from app.controllers.engine_host import EngineHost
    from qt_helpers import make_window

    gate = threading.Event()

    def slow_loader(spec, backend, progress):
        def load():
            progress("converting the model", 0.5)
            gate.wait(10)
            return MockBackend(delay_s=0.001)

        from engine.worker import ModelWorker

        return Engine(ModelWorker(load))

    host = EngineHost(slow_loader)
    w = make_window(qtbot, store, host)
    try:
        task = w.start("mock", "mock")
        qtbot.waitUntil(lambda: w.status.progress.isVisible() and "converting" in w.status.progress_label.text())
        assert w.status.progress.value() == 500
        # Usable while loading: a question typed now is answered once the model is there.
        w.chat.composer.edit.setPlainText("the cat")
        w.chat.composer.submit()
        qtbot.waitUntil(lambda: len(w.library.current.path()) == 2)
        assert "waiting for the model" in w.chat.chat_view.widget_for(w.library.current.path()[1].id).footer.text()
        gate.set()
        qtbot.waitUntil(task.done, timeout=5000)
        qtbot.waitUntil(lambda: not w.controller.busy, timeout=5000)
        assert not w.status.progress.isVisible()
        assert w.library.current.path()[1].tokens
    finally:
        gate.set()
        w.close()
        qtbot.waitUntil(lambda: w._shutdown_done, timeout=5000)
        host.close()
