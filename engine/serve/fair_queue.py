"""Turns at one model, fair between clients: each client waits in its own line, and the lines take turns.

The `Engine` runs one generation at a time on its worker thread, first come first served; a client that
sends twenty requests at once would hold everyone else for all twenty. Here each client (its address) has a
line, and when the model is free the next turn goes to the client whose last turn is the oldest (one that
never had one first), so a second client waits at most one answer of the first. `max_running` turns run at once (1: the model's worker gets one served
request at a time and the window's own chats are never behind more than one); past `max_waiting` waiting
requests the server is busy (503). Used from the server's event loop only.

Sharing a turn: a request that can be a row of the model's batch comes with a `rider` (anything; the queue
only hands it on). When a turn goes to such a request, the other waiting riders that `joins(taken, candidate)`
accepts come along, taken in the same fair order (each client's oldest request, clients served longest ago
first, round after round): the turn's `Turn.riders`. Those requests' own `turn` then says `joined` (their
answers come through the rider, from the batch the first one runs) and they hold no turn of their own. The
turn's holder may `hand_over()` its end to whatever runs the batch, so that the model is free only when the
batch is done, even if the holder's client left first.

Joining a batch under way: a rider that comes while the model is busy, with nobody waiting, is first offered
to `join_running` (the running batch, if it takes newcomers); taken, its turn says `joined` at once. With
anyone waiting it waits too, so a request that runs alone (or did not fit the batch) is never overtaken by
later ones, and the batch, taking no newcomers, ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.serve.errors import ApiError
from engine.serve.limits import MAX_WAITING


CANCEL_POLL_S = 0.05  # how often a waiting request looks whether it was stopped (a threading.Event)


class TurnAbandoned(Exception):
    """The request was stopped (the window's Stop) while it waited: it never gets its turn."""


_JOINED = object()  # a waiter's ticket result: its rider was taken into another request's turn


@dataclass(eq=False)
class _Ticket:
    future: asyncio.Future[object]  # result: None (this request's own turn) or _JOINED
    rider: Any = None  # what this request shares a turn as (None: it runs alone)
    riders: list[Any] = field(default_factory=list)  # (own turn:) the riders taken along


@dataclass(eq=False)
class Turn:
    """What a request got: its own turn (with `riders`, the other requests taken along), or `joined`."""

    joined: bool = False
    riders: list[Any] = field(default_factory=list)
    waited: bool = False  # it waited in line: others use the model now, and more may come while it runs
    _release: Callable[[], None] | None = None
    _handed_over: bool = False

    def hand_over(self) -> Callable[[], None]:
        """The turn does not end with the `turn` block: call the returned function (once) to end it."""
        assert self._release is not None and not self.joined and not self._handed_over, \
            "only a turn's holder hands it over, once"
        self._handed_over = True
        return self._release


class FairQueue:
    def __init__(self, max_running: int = 1, max_waiting: int = MAX_WAITING,
                 joins: Callable[[Sequence[Any], Any], bool] | None = None) -> None:
        """`joins(taken, candidate)`: whether a waiting rider can share the turn of the riders `taken` so far
        (the first is the turn holder's own); None: requests never share a turn."""
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.joins = joins
        # A running batch's offer: True when it takes the rider now (set while a batch that admits rows runs).
        self.join_running: Callable[[Any], bool] | None = None
        self.running = 0
        self._lines: OrderedDict[str, deque[_Ticket]] = OrderedDict()
        self._last_turn: dict[str, int] = {}  # client -> the number of its latest turn (fewer: served longer ago)
        self._turns = 0

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    @asynccontextmanager
    async def turn(self, client: str, cancel: threading.Event | None = None, rider: Any = None
                   ) -> AsyncIterator[Turn]:
        """Wait for this client's turn at the model, hold it in the block; 503 when too many wait.

        `cancel` set while waiting raises `TurnAbandoned` at once (not after the answers ahead of it). `rider`:
        this request can share a turn (see the module's docstring).
        """
        ticket = _Ticket(asyncio.get_running_loop().create_future(), rider)
        if (rider is not None and self.running and not self.waiting and self.join_running is not None
                and self.join_running(rider)):
            self._note_turn(client)
            yield Turn(joined=True)
            return
        waited = self.running >= self.max_running or bool(self.waiting)
        if waited:
            if self.waiting >= self.max_waiting:
                raise ApiError(503, f"the model is busy: {self.waiting} requests are waiting; try again shortly",
                               code="server_busy")
            self._lines.setdefault(client, deque()).append(ticket)
            try:
                while cancel is not None and not ticket.future.done():
                    if cancel.is_set():
                        raise TurnAbandoned()
                    await asyncio.wait({ticket.future}, timeout=CANCEL_POLL_S)
                await ticket.future
            except BaseException:
                if ticket.future.done() and not ticket.future.cancelled():
                    if ticket.future.result() is None:
                        self._release()  # the turn was given just as the waiter left: hand it on
                    # (joined: the batch runs without it; its rows end at its cancel)
                else:
                    self._forget(client, ticket)
                raise
        else:
            self.running += 1
        self._note_turn(client)
        if ticket.future.done() and ticket.future.result() is _JOINED:
            yield Turn(joined=True)
            return
        turn = Turn(riders=ticket.riders, waited=waited, _release=self._release_once())
        try:
            yield turn
        finally:
            if not turn._handed_over:
                self._release()

    def _release_once(self) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release()
        return release

    def _forget(self, client: str, ticket: _Ticket) -> None:
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

    def _fair_clients(self) -> list[str]:
        """Clients with a waiting request, the one served longest ago first (ties: the line that formed first)."""
        return sorted(self._lines, key=lambda c: self._last_turn.get(c, 0))

    def _pop(self, client: str) -> _Ticket:
        line = self._lines[client]
        ticket = line.popleft()
        if not line:
            del self._lines[client]
        return ticket

    def _release(self) -> None:
        """The turn ends: give it to the first waiter of the client served longest ago (and its riders)."""
        self.running -= 1
        while self._lines and self.running < self.max_running:
            client = self._fair_clients()[0]
            ticket = self._pop(client)
            if ticket.future.done():
                continue
            self.running += 1
            if ticket.rider is not None and self.joins is not None:
                ticket.riders = self._take_riders(ticket.rider, client)
            ticket.future.set_result(None)

    def _take_riders(self, first: Any, holder: str) -> list[Any]:
        """The waiting riders that come along with `first` (of client `holder`, who counts as just served): each
        client's oldest in fair order, round after round (a client's requests keep their order: one that runs
        alone stops its line's riders)."""
        assert self.joins is not None
        taken = [first]
        added = True
        while added:
            added = False
            clients = self._fair_clients()
            for client in [c for c in clients if c != holder] + [c for c in clients if c == holder]:
                head = self._lines[client][0]
                if head.future.done() or head.rider is None or not self.joins(taken, head.rider):
                    continue
                self._pop(client)
                taken.append(head.rider)
                head.future.set_result(_JOINED)
                added = True
        return taken[1:]
