"""Turns at one model, fair between clients: each client waits in its own line, and the lines take turns.

The `Engine` runs one generation at a time on its worker thread, first come first served; a client that
sends twenty requests at once would hold everyone else for all twenty. Here each client (its address) has a
line, and when the model is free the next turn goes to the client whose last turn is the oldest (one that
never had one first), so a second client waits at most one answer of the first. `max_running` turns run at once (1: the model's worker gets one served
request at a time and the window's own chats are never behind more than one); past `max_waiting` waiting
requests the server is busy (503). Used from the server's event loop only.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from engine.serve.errors import ApiError
from engine.serve.limits import MAX_WAITING


CANCEL_POLL_S = 0.05  # how often a waiting request looks whether it was stopped (a threading.Event)


class TurnAbandoned(Exception):
    """The request was stopped (the window's Stop) while it waited: it never gets its turn."""


class FairQueue:
    def __init__(self, max_running: int = 1, max_waiting: int = MAX_WAITING) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self._lines: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._last_turn: dict[str, int] = {}  # client -> the number of its latest turn (fewer: served longer ago)
        self._turns = 0

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    @asynccontextmanager
    async def turn(self, client: str, cancel: threading.Event | None = None) -> AsyncIterator[None]:
        """Wait for this client's turn at the model, hold it in the block; 503 when too many wait.

        `cancel` set while waiting raises `TurnAbandoned` at once (not after the answers ahead of it).
        """
        if self.running >= self.max_running or self.waiting:
            if self.waiting >= self.max_waiting:
                raise ApiError(503, f"the model is busy: {self.waiting} requests are waiting; try again shortly",
                               code="server_busy")
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._lines.setdefault(client, deque()).append(ticket)
            try:
                while cancel is not None and not ticket.done():
                    if cancel.is_set():
                        raise TurnAbandoned()
                    await asyncio.wait({ticket}, timeout=CANCEL_POLL_S)
                await ticket
            except BaseException:
                if ticket.done() and not ticket.cancelled():
                    self._release()  # the turn was given just as the waiter left: hand it on
                else:
                    self._forget(client, ticket)
                raise
        else:
            self.running += 1
        self._note_turn(client)
        try:
            yield
        finally:
            self._release()

    def _forget(self, client: str, ticket: asyncio.Future[None]) -> None:
        line = self._lines.get(client)
        if line is not None and ticket in line:
            line.remove(ticket)
            if not line:
                del self._lines[client]

    def _note_turn(self, client: str) -> None:
        self._turns += 1
        self._last_turn.pop(client, None)
        self._last_turn[client] = self._turns
        if len(self._last_turn) > 4096:  # forget the clients served longest ago (they count as new again)
            del self._last_turn[next(iter(self._last_turn))]

    def _release(self) -> None:
        """The turn ends: give it to the first waiter of the client served longest ago."""
        self.running -= 1
        while self._lines and self.running < self.max_running:
            client = min(self._lines, key=lambda c: self._last_turn.get(c, 0))  # ties: the line that formed first
            line = self._lines[client]
            ticket = line.popleft()
            if not line:
                del self._lines[client]
            if not ticket.done():
                self.running += 1
                ticket.set_result(None)
