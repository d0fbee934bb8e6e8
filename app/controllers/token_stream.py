"""One generation's events, moved from the engine's worker thread to the event loop in frame-sized batches.

The worker calls `_on_event` for every token. Crossing threads once per
token would cost a queued Qt event each and make the views redraw per token;
instead events pile up in a deque, the first one of a frame wakes the loop,
and the loop takes everything that arrived at most once per `frame_s`
(~60 Hz). A slow model still gets every token shown at once (an idle frame
flushes immediately); a fast one gets a few tokens per redraw.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from engine import Done, Engine, GenerationRequest, GenerationStats, TokenEvent, loom

FRAME_S = 1 / 60
T = TypeVar("T")


class FrameHop(Generic[T]):
    """Items `put` on any thread reach `deliver(batch)` on the event loop, in order, at most once per frame.

    The one way the app moves a stream of worker-thread items to the loop: a generation's events
    (`TokenStream`) and a served request's (app/controllers/served_conversations.py, on the server's thread).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[list[T]], None], frame_s: float = FRAME_S):
        self._loop = loop
        self._deliver = deliver
        self._frame_s = frame_s
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._last_flush = float("-inf")

    def put(self, item: T) -> None:
        """Any thread. Raises RuntimeError once the loop is closed (nobody is left to deliver to)."""
        with self._lock:
            self._items.append(item)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._schedule)

    def take_now(self) -> list[T]:
        """On the loop: what arrived and is not delivered yet (a closing owner handles it at once)."""
        with self._lock:
            batch = list(self._items)
            self._items.clear()
        return batch

    def _schedule(self) -> None:
        delay = self._last_flush + self._frame_s - self._loop.time()
        if delay <= 0:
            self._flush()
        else:
            self._loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        with self._lock:
            batch = list(self._items)
            self._items.clear()
            self._wake_pending = False
        self._last_flush = self._loop.time()
        if batch:
            self._deliver(batch)


class TokenStream:
    """`async for batch in stream.batches()`: lists of `TokenEvent`s; then `stats` holds the final stats."""

    def __init__(self, engine: Engine, request: GenerationRequest, frame_s: float = FRAME_S, *,
                 step: loom.StepGate | None = None):
        self._batches: asyncio.Queue[list[TokenEvent | Done | BaseException]] = asyncio.Queue()
        self._hop: FrameHop[TokenEvent | Done | BaseException] = FrameHop(
            asyncio.get_running_loop(), self._batches.put_nowait, frame_s)
        self.stats: GenerationStats | None = None
        self.handle = engine.submit(request, self._on_event, step=step)  # step: step mode's gate, or None

    def cancel(self) -> None:
        """Stop before the next token; the tokens already made still arrive, then `Done`."""
        self.handle.cancel()

    def _on_event(self, event: TokenEvent | Done | BaseException) -> None:
        """Worker thread. Raises RuntimeError once the loop is closed; the worker then cancels the generation."""
        self._hop.put(event)

    async def batches(self) -> AsyncIterator[list[TokenEvent]]:
        """Token batches in order; returns after `Done` (see `stats`), raises the engine's exception."""
        try:
            while True:
                tokens: list[TokenEvent] = []
                for event in await self._batches.get():
                    if isinstance(event, TokenEvent):
                        tokens.append(event)
                        continue
                    if tokens:
                        yield tokens
                    if isinstance(event, Done):
                        self.stats = event.stats
                        return
                    raise event
                if tokens:
                    yield tokens
        finally:
            if self.stats is None:
                self.handle.cancel()  # the consumer left early
