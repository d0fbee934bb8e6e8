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

from app.engine_host import EngineHost
from app.state.store import Store
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


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem) -> None:
    """After the last window test in a row, everything is collected here once, and CPython collects as
    usual again for the tests that follow (the engine's, which never run the Qt loop the collector needs)."""
    global _gc_collector
    if _gc_collector is not None and (nextitem is None or Path(__file__).parent not in nextitem.path.parents):
        _gc_collector.stop()
        _gc_collector.deleteLater()
        _gc_collector = None


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


@pytest.fixture
def closing(qtbot) -> Iterator:
    """Close a delete-on-close window at teardown, unless Qt has deleted it already.

    `qtbot.addWidget` closes every widget it holds at teardown; a compare, replay or
    score window deletes itself when closed, and if Qt has already run that deletion,
    pytest-qt's `close()` raises "Internal C++ object already deleted" and fails the
    next test's setup. Whether it has depends on when the event loop last spun, so the
    failure came and went with timing.
    """
    import shiboken6

    opened: list = []
    yield opened.append
    for widget in opened:
        if shiboken6.isValid(widget):
            widget.close()
    qtbot.wait(0)  # let the deferred deletes run here, not in the next test
