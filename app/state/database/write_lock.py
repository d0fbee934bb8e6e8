"""Another connection holding SQLite's write lock: how long a write waits, and the error it then raises.

A second Logit Lab on the same file (or a script) can hold the lock for seconds; SQLite's own busy wait would
block the UI thread that long, so `Store` waits at most `BUSY_TIMEOUT_S` and raises `DatabaseBusy`, and the
window's actions wait on the event loop instead (app/state/database/write_queue.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager

BUSY_TIMEOUT_S = 0.1  # the longest one write blocks the UI thread when another connection holds the lock
OPEN_TIMEOUT_S = 10.0  # opening and closing: no window to keep responsive, and nothing may be lost
BUSY_TEXT = "database is busy (another Logit Lab?) - waiting"


class DatabaseBusy(sqlite3.OperationalError):
    """Another connection holds the database's write lock: nothing was written; try again in a moment."""


def is_busy(error: BaseException) -> bool:
    """A write failed because another connection holds the lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    if isinstance(error, DatabaseBusy):
        return True
    if not isinstance(error, sqlite3.OperationalError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "database is locked" in str(error) or "database table is locked" in str(error)


@contextmanager
def busy_as_database_busy(on_busy: Callable[[], None]) -> Iterator[None]:
    """Turn SQLite's "database is locked" into `DatabaseBusy` (nothing written), calling `on_busy` first."""
    try:
        yield
    except sqlite3.OperationalError as e:
        if is_busy(e) and not isinstance(e, DatabaseBusy):
            on_busy()
            raise DatabaseBusy(BUSY_TEXT) from e
        raise
