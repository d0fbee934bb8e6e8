"""The app's life from database to exit, shared by `python -m app` and the self-test driver.

`open_session` opens the database whatever state it is in (app/state/recovery.py),
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

from PySide6.QtWidgets import QApplication

from app.engine_host import EngineHost
from app.main_window import MainWindow
from app.paths import database_path
from app.state.recovery import DatabaseNotice, open_database
from app.state.store import Store
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


def open_session(appearance: str | None = None) -> Session:
    """Open the database and the window (shown); the start-up notice is open on top when there is one."""
    from app.main_window import APPEARANCE_KEY

    app = QApplication.instance()
    opened = open_database(database_path())
    store = opened.store
    theme = Theme(app, appearance or store.get_setting(APPEARANCE_KEY, "system"))
    host = EngineHost()
    window = MainWindow(store, host, theme)
    closed = asyncio.get_running_loop().create_future()
    window.closed.connect(lambda: closed.done() or closed.set_result(None))
    install_quit_handlers(window)
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
    session.host.close()
    session.store.close()  # checkpoints: no -wal is left behind
