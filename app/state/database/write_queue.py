"""UI actions that write (new, rename, delete, switch chats...) when another connection holds the write lock.

The store waits at most `BUSY_TIMEOUT_S` for SQLite's write lock and then raises `DatabaseBusy`, having written
nothing (app/state/database/store.py). An action the person asked for is then not dropped and raises nothing into Qt:
it waits here, in order, and runs again from the event loop once the lock is free (`Store.wait_writable` polls
without blocking the loop); the store's `busy_changed` has already told the window, whose status bar says so.
Closing the store runs what still waits (it waits for the lock then: nothing may be lost).

An action runs inside one store transaction (`atomic=True`): BEGIN IMMEDIATE takes the lock before the action
changes anything, so a busy database stops it before its first change, and once it runs no write inside it can
meet the lock. Actions that may write nothing at all (opening a chat writes only when the one left has unsaved
tokens) run with `atomic=False`, so they do not wait for a lock they do not need; they must raise `DatabaseBusy`
before they change anything (opening flushes the chat it leaves first).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.state.database.store import DatabaseBusy, Store

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often a waiting action looks for the lock to be free


@dataclass
class _Waiting:
    what: str  # e.g. "renaming the chat": for the log and the status bar
    action: Callable[[], Any]
    atomic: bool


class WriteQueue:
    """The store's waiting UI writes (one per store: `write_queue(store)`)."""

    def __init__(self, store: Store):
        self.store = store
        self.waiting: list[_Waiting] = []
        # Optional callback (what, error text): an action failed for another reason than the lock.
        self.failed: Callable[[str, str], None] | None = None
        self._task: asyncio.Task | None = None

    def run(self, what: str, action: Callable[[], Any], atomic: bool = True) -> bool:
        """Run `action` now, or, while another connection holds the write lock, once it is free (in the order
        asked). True if it ran now. Errors other than the lock propagate as before."""
        if self.waiting:  # an earlier action still waits: this one goes after it, never before
            self._enqueue(_Waiting(what, action, atomic))
            return False
        try:
            self._attempt(_Waiting(what, action, atomic))
            return True
        except DatabaseBusy:
            self._enqueue(_Waiting(what, action, atomic))
            return False

    def _attempt(self, item: _Waiting) -> None:
        if not item.atomic:
            item.action()
            return
        error: BaseException | None = None
        with self.store.transaction():  # raises DatabaseBusy here, before the action has changed anything
            try:
                item.action()
            except DatabaseBusy:
                raise
            except Exception as e:  # noqa: BLE001 - what was written stays written, as without this wrapper
                error = e
        if error is not None:
            raise error

    def _enqueue(self, item: _Waiting) -> None:
        log.info("the database is busy: %s waits for the write lock", item.what)
        self.waiting.append(item)
        if self._task is None or self._task.done():
            try:
                self._task = asyncio.get_running_loop().create_task(self._drain())
            except RuntimeError:  # no loop running (a script, closing): the store's close runs what waits
                self._task = None

    async def _drain(self) -> None:
        while self.waiting and not self.store.closed:
            if not await self.store.wait_writable(POLL_S, cancelled=lambda: self.store.closed):
                return
            if not self._run_first():
                await asyncio.sleep(POLL_S)  # taken again between the check and the write

    def _run_first(self) -> bool:
        """Run the first waiting action; False if the lock was taken again in between (it stays first)."""
        item = self.waiting[0]
        try:
            self._attempt(item)
        except DatabaseBusy:
            return False
        except (sqlite3.Error, ValueError, KeyError) as e:
            self.waiting.pop(0)
            log.error("%s failed after waiting for the database: %s", item.what, e)
            if self.failed is not None:
                self.failed(item.what, str(e))
            return True
        self.waiting.pop(0)
        log.info("%s: done now that the database is free", item.what)
        return True

    async def settled(self) -> None:
        """Wait on the event loop until nothing waits here and a write can start (an action that must come
        after what the person did before it, e.g. a notebook's Generate after its text was saved)."""
        while self.waiting or not self.store.can_write_now():
            if self.store.closed:
                return
            await asyncio.sleep(POLL_S)

    async def drained(self) -> None:
        """Wait on the event loop until the actions asked for earlier have run (not for the lock itself): what
        the person does next must see their result, e.g. a message typed after a waiting New chat goes into the
        new chat, not the one open while it waited."""
        while self.waiting and not self.store.closed:
            await asyncio.sleep(POLL_S)

    def run_waiting_now(self) -> None:
        """Closing: run what still waits (the store waits long for the lock then); failures are logged."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        while self.waiting:
            try:
                done = self._run_first()
            except Exception:  # noqa: BLE001 - closing goes on; the log keeps why
                log.exception("%s failed while closing", self.waiting.pop(0).what)
                continue
            if not done:
                log.error("%s was not done: the database stayed locked by another connection", self.waiting[0].what)
                self.waiting.pop(0)


def write_queue(store: Store) -> WriteQueue:
    """The store's one queue of waiting UI writes (made on first use)."""
    queue = store.write_queue
    if not isinstance(queue, WriteQueue):
        queue = WriteQueue(store)
        store.write_queue = queue
    return queue
