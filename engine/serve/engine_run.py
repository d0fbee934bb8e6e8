"""One served request on the `Engine`, as an async stream of (choice index, event) on the server's loop.

`n` = 1 is an ordinary generation (`Engine.submit`); `n` > 1 asks the loom for N children of the prompt
(`engine.loom.continuation_events`): one batch on a backend with batch runners, one after another otherwise,
each child seeded `seed + index`. Events cross from the model's worker thread with `call_soon_threadsafe`.
Setting `cancel` (a client gone, the window's Stop) ends the generation before its next token; the stream then
still ends with each choice's `Done` (finish reason "cancelled").
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import cast

from engine.backends.base import Backend
from engine.engine import Engine
from engine.errors import EngineError
from engine.events import Done, Event
from engine.request import GenerationRequest

_FINISHED = object()  # the worker's job is over (after the last Done, or after an error)


async def engine_events(engine: Engine, request: GenerationRequest, n: int,
                        cancel: threading.Event) -> AsyncIterator[tuple[int, Event]]:
    """Every event of the request's `n` choices, each choice ending with its Done; raises the run's error."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()

    def put(item: object) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    if n == 1:
        try:
            handle = engine.submit(request, lambda event: put((0, event)))
        except RuntimeError as e:  # the model closed while this request waited its turn (another model, quitting)
            raise EngineError(f"the model was closed before this answer's turn ({e})") from None
        # The handle's own event is the one the worker watches: link ours to it.
        watcher = loop.create_task(_link(cancel, handle.cancel_event))
    else:
        from engine.fingerprinting import rows_with_fingerprint
        from engine.loom.continuations import continuation_events

        def job(backend: Backend) -> None:
            # Each choice's stats carry its fingerprint, marked as one of n rows decoded together (a replay of
            # one choice alone may round differently, and then says why).
            rows = rows_with_fingerprint(backend, request, n, continuation_events(backend, request, n, cancel=cancel))
            for row_event in rows:
                put((row_event.row, row_event.event))

        try:
            future = engine.call(job)
        except RuntimeError as e:
            raise EngineError(f"the model was closed before this answer's turn ({e})") from None
        future.add_done_callback(lambda fut: put(fut.exception() or _FINISHED))
        watcher = None
    left = n
    try:
        while left:
            item = await queue.get()
            if item is _FINISHED:
                return
            if isinstance(item, BaseException):
                raise item
            index, event = cast("tuple[int, Event | BaseException]", item)
            if isinstance(event, BaseException):
                raise event
            yield index, event
            if isinstance(event, Done):
                left -= 1
    finally:
        cancel.set()  # leaving early (the client went away): the generation stops before its next token
        if n == 1:
            handle.cancel_event.set()
        if watcher is not None:
            watcher.cancel()


async def _link(ours: threading.Event, theirs: threading.Event) -> None:
    """Set `theirs` when `ours` is set (polled: a threading.Event has no awaitable)."""
    while not ours.is_set():
        await asyncio.sleep(0.05)
    theirs.set()
