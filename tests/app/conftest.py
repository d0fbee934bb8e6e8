"""Fixtures for window tests: a running qasync loop inside pytest-qt, a temp database, the mock engine.

pytest-qt spins the Qt event loop (`qtbot.waitUntil`); a qasync loop marked
`already_running` makes that same Qt loop run asyncio tasks, so the window's
async slots work exactly as under `asyncio.run(..., loop_factory=QEventLoop)`.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import qasync

from app.controllers.engine_host import EngineHost
from app.state.database.store import Store
from app.ui_thread_gc import UiThreadGarbageCollector
from qt_helpers import close_window, make_window, mock_factory, run_task

_gc_collector: UiThreadGarbageCollector | None = None


@pytest.fixture(autouse=True)
def _gc_on_ui_thread(qapp) -> Iterator[None]:
    """Cycles are collected on the UI thread while the window tests run, as in the app (app/ui_thread_gc.py).

    Automatic collection in a background thread once deadlocked this suite inside PySide6 (a closed window's
    widgets destroyed from a model thread while the next test built its window). A test that turns it back on
    fails here, and it is turned off again: one did (`gc.enable()` after a measurement), and a later test hung
    in that same deadlock.
    """
    global _gc_collector
    if _gc_collector is None:
        _gc_collector = UiThreadGarbageCollector(qapp)
    yield
    if gc.isenabled():
        gc.disable()
        pytest.fail("the test left Python's automatic garbage collection on: a collection on a worker thread can "
                    "deadlock PySide6; restore what gc.isenabled() said before")


@pytest.fixture(scope="session")
def _session_loop(qapp) -> asyncio.AbstractEventLoop:
    # One loop for the session: stopping a qasync loop calls QApplication.exit(), which would
    # cut short every later wait of the session, so the loop simply lives as long as qapp.
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    return loop


@pytest.fixture
def qloop(qapp, _session_loop) -> Iterator[asyncio.AbstractEventLoop]:
    """The running qasync loop; tasks a test leaves behind are cancelled after it.

    The loop is marked as this thread's running loop only during the test: left
    marked, it would make every later `asyncio.run()` in the session (engine
    tests) fail with "cannot be called from a running event loop".
    """
    asyncio.events._set_running_loop(_session_loop)
    yield _session_loop
    pending = [t for t in asyncio.all_tasks(_session_loop) if not t.done()]
    for task in pending:
        task.cancel()
    for _ in range(100):
        if all(t.done() for t in pending):
            break
        qapp.processEvents()
    asyncio.events._set_running_loop(None)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    monkeypatch.setenv("LOGITLAB_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def db_path(data_dir):
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir / "test.sqlite3"


@pytest.fixture
def store(db_path) -> Iterator[Store]:
    s = Store(db_path)
    yield s
    s.close()


@pytest.fixture
def host() -> Iterator[EngineHost]:
    h = EngineHost(mock_factory())
    yield h
    h.close()


@pytest.fixture
def window(qtbot, qloop, store, host):
    """The real main window on the mock model (loaded), answers capped at 24 tokens."""
    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host)
    yield w
    if not w._shutdown_done:
        close_window(qtbot, w)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # before pytest-qt's teardown closes what qtbot holds
def pytest_runtest_teardown(item, nextitem):
    """Forget the widgets Qt has deleted already, so pytest-qt closes only live ones; after the last window
    test in a row, stop collecting garbage on the UI thread.

    `qtbot.addWidget` closes every widget it holds at teardown. A compare, replay, score or model-diff
    window deletes itself when closed (WA_DeleteOnClose); when a test closed it and the loop then ran that
    deletion, pytest-qt's `close()` raised "Internal C++ object already deleted" and failed the next test's
    setup. Whether it did depended on timing and on whether a cycle still held the Python wrapper (automatic
    garbage collection is off here, see _gc_on_ui_thread): it failed on CI's Python 3.13 and passed here.
    Deferred deletions still queued are run first, so none lands between this check and pytest-qt's close.
    """
    import shiboken6
    from PySide6.QtCore import QCoreApplication, QEvent

    if QCoreApplication.instance() is not None:
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    held = getattr(item, "qt_widgets", None)
    if held:
        item.qt_widgets = [(ref, before) for ref, before in held if ref() is not None and shiboken6.isValid(ref())]
    result = yield  # pytest-qt closes the live widgets; the test's fixtures are torn down
    # After the last window test in a row, everything is collected here once, and CPython collects as usual
    # again for the tests that follow (the engine's, which never run the Qt loop the collector needs).
    global _gc_collector
    if _gc_collector is not None and (nextitem is None or Path(__file__).parent not in nextitem.path.parents):
        _gc_collector.stop()
        _gc_collector.deleteLater()
        _gc_collector = None
    return result


@pytest.fixture
def closing(qtbot):
    """Close a delete-on-close window at teardown (qtbot.addWidget, safe for it by the hook above)."""
    return qtbot.addWidget
