"""Requests that join a shared batch while it decodes: offered from the server's loop, taken on the model's worker.

The inbox is open from the moment the batch is made, before the model's worker starts it. Where its runner
can admit rows (`engine.capabilities.AdmitsRows`), the batch takes what was offered between two steps and
prefills it as new rows; when no row goes on, or when other work waits for the model, it closes the inbox.
Where the runner cannot, the batch closes the inbox as it starts. Either way what was offered before the
close is still run (an accepted offer is never dropped: as rows of this batch, or as a batch of its own right
after it). An offer to a closed inbox is refused, and the request then waits for its own turn as usual.
The lock makes "offered" and "closed" one order for both threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class BatchInbox(Generic[T]):
    """Open from the start (offers made before the batch's first step are taken at it); `offer` from any
    thread, `close` and `take` on the batch's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[T] = []
        self._open = True

    @property
    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        """Refuse every later offer; what was offered before stays to be taken."""
        with self._lock:
            self._open = False

    def offer(self, item: T, on_accept: Callable[[], None] | None = None) -> bool:
        """Hand `item` to the running batch; False when it no longer (or not yet) takes newcomers.

        `on_accept` runs under the lock when it is taken, before the batch can see it: what the batch's thread
        needs to know of the newcomer (where its events go) is in place by the time it runs."""
        with self._lock:
            if not self._open:
                return False
            if on_accept is not None:
                on_accept()
            self._waiting.append(item)
            return True

    def take(self, *, close: bool = False) -> list[T]:
        """What was offered since the last take, in offer order; `close`: refuse every later offer."""
        with self._lock:
            taken, self._waiting = self._waiting, []
            if close:
                self._open = False
            return taken
