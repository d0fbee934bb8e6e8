"""The app's life from database to exit, shared by `python -m app` and the self-test driver.

`open_session` opens the database whatever state it is in (app/state/database/recovery.py),
builds the window, shows it, and tells the user about the database if there
is anything to tell. `install_quit_handlers` makes SIGTERM, SIGHUP and SIGINT
(logout, shutdown, a process manager, Ctrl+C) and Qt's `aboutToQuit` end the
app the way closing the window does: stop the generation, write the pending
tokens, mark the answer interrupted; `close_session` then checkpoints the
WAL and closes the database.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication

from app.controllers.engine_host import EngineHost
from app.main_window import MainWindow
from app.state.paths import database_path
from app.state.database.recovery import DatabaseNotice, open_database
from app.state.database.store import Store
from app.theme import Theme

log = logging.getLogger(__name__)

QUIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))
CLOSE_TIMEOUT_S = 60.0  # the window's own shutdown waits at most 10 s for the generation; this bounds the rest


@dataclass
class Session:
    store: Store
    host: EngineHost
    window: MainWindow
    closed: asyncio.Future
    notice: DatabaseNotice | None


def open_session(appearance: str | None = None, host: EngineHost | None = None) -> Session:
    """Open the database and the window (shown); the start-up notice is open on top when there is one.

    `host`: the engine host to use (tests pass one with their own engines); a new one by default.
    """
    from app.main_window import APPEARANCE_KEY

    app = QApplication.instance()
    if not isinstance(app, QApplication):  # checked before the database opens: nothing is left half-open
        raise RuntimeError("the window needs a QApplication: make one before opening the session")
    opened = open_database(database_path())
    store = opened.store
    theme = Theme(app, appearance or store.get_setting(APPEARANCE_KEY, "system"))
    host = host or EngineHost()
    window = MainWindow(store, host, theme)
    closed = asyncio.get_running_loop().create_future()

    def mark_closed() -> None:
        if not closed.done():
            closed.set_result(None)

    window.closed.connect(mark_closed)
    install_quit_handlers(window)
    window.installEventFilter(_StopWorkOnClose(host, window))
    window.show()
    if opened.notice is not None:
        window.show_database_notice(opened.notice)
    return Session(store, host, window, closed, opened.notice)


def install_quit_handlers(window: MainWindow) -> None:
    """SIGTERM/SIGHUP/SIGINT close the window as the user would; Qt quitting writes what is pending."""
    loop = asyncio.get_running_loop()
    for sig in QUIT_SIGNALS:
        try:
            # qasync's loop is a selector loop on Unix: the signal wakes Qt through the loop's self-pipe,
            # so the handler runs at once even while Qt sits in its own event loop.
            loop.add_signal_handler(sig, window.interrupt, sig.name)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows: no add_signal_handler
            signal.signal(sig, lambda signum, _frame: loop.call_soon_threadsafe(window.interrupt, signal.Signals(signum).name))
    app = QApplication.instance()
    if app is not None:
        app.aboutToQuit.connect(window.flush_now)


class _StopWorkOnClose(QObject):
    """When the window starts closing (its button, Ctrl-C, a signal), stop the work that would hold the close.

    The window's shutdown waits for the answer under way to end and write its tokens. An answer that
    waits for a model still loading (a server that never answers: for good), or for a chat template
    still rendering (up to its time limit), held it 10 s. So: the load is cancelled, the model's
    queued and running work is cancelled, jobs waiting for a thread are dropped, and a template
    render under way is stopped. The answer then ends at once and the window writes what it has.
    Before all that, the answers served to clients (Model ▸ Serve…) end as Stop ends them, so that no
    request waiting for its turn reaches a model whose thread is closing; the window then stops the server.
    """

    def __init__(self, host: EngineHost, window: MainWindow):
        super().__init__(window)
        self._host = host
        self._serving = window.serving

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.Close:
            self._serving.end_answers()
            stop_engine_work(self._host)
        return False  # the window's own closeEvent runs as ever


def stop_engine_work(host: EngineHost) -> None:
    """Cancel everything `host` has under way or queued, without waiting for any of it (quitting)."""
    from engine import end_template_renders

    engine = host.engine
    if host.cancel_load():
        log.info("closing: the model that was loading is not waited for")
    if engine is not None:
        engine.close(timeout=0, cancel=True)  # its thread ends after its current step, releasing the model
    host.close(wait=False)  # drops the jobs waiting for a thread (a count, a render)
    end_template_renders()  # renders asked for until now end at once; a later one starts a new renderer


def remove_quit_handlers(window: MainWindow) -> None:
    loop = asyncio.get_running_loop()
    for sig in QUIT_SIGNALS:
        try:
            loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    app = QApplication.instance()
    if app is not None:
        try:
            app.aboutToQuit.disconnect(window.flush_now)
        except (RuntimeError, TypeError):
            pass


async def close_session(session: Session) -> None:
    """After the window has closed (or to close it): release the model, checkpoint and close the database."""
    if not session.closed.done():
        session.window.close()
        try:
            await asyncio.wait_for(asyncio.shield(session.closed), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.error("the window did not finish closing within %g s; quitting anyway", CLOSE_TIMEOUT_S)
    remove_quit_handlers(session.window)
    # Never waits: each model is released on its own thread (a busy one was cancelled when the window
    # started closing). The process's end waits a moment for them (app/__main__.py, or at exit).
    stop_engine_work(session.host)
    session.store.close()  # checkpoints: no -wal is left behind
