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
from collections.abc import AsyncIterator

from engine import Done, Engine, GenerationRequest, GenerationStats, TokenEvent

FRAME_S = 1 / 60


class TokenStream:
    """`async for batch in stream.batches()`: lists of `TokenEvent`s; then `stats` holds the final stats."""

    def __init__(self, engine: Engine, request: GenerationRequest, frame_s: float = FRAME_S):
        self._loop = asyncio.get_running_loop()
        self._frame_s = frame_s
        self._events: deque[TokenEvent | Done | BaseException] = deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._last_flush = float("-inf")
        self._batches: asyncio.Queue[list[TokenEvent | Done | BaseException]] = asyncio.Queue()
        self.stats: GenerationStats | None = None
        self.handle = engine.submit(request, self._on_event)

    def cancel(self) -> None:
        """Stop before the next token; the tokens already made still arrive, then `Done`."""
        self.handle.cancel()

    # -- worker thread ---------------------------------------------------------------------

    def _on_event(self, event: TokenEvent | Done | BaseException) -> None:
        with self._lock:
            self._events.append(event)
            if self._wake_pending:
                return
            self._wake_pending = True
        # Raises RuntimeError once the loop is closed; the worker then cancels the generation.
        self._loop.call_soon_threadsafe(self._schedule)

    # -- event loop ------------------------------------------------------------------------

    def _schedule(self) -> None:
        delay = self._last_flush + self._frame_s - self._loop.time()
        if delay <= 0:
            self._flush()
        else:
            self._loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        with self._lock:
            batch = list(self._events)
            self._events.clear()
            self._wake_pending = False
        self._last_flush = self._loop.time()
        if batch:
            self._batches.put_nowait(batch)

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
