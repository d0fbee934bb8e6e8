"""One served request on the `Engine`, as an async stream of (choice index, event) on the server's loop.

`n` = 1 is an ordinary generation (`Engine.submit`); `n` > 1 asks the loom for N children of the prompt
(`engine.loom.continuation_events`): one batch on a backend with batch runners, one after another otherwise,
each child seeded `seed + index`. Several requests that waited together can share one batch
(`shared_batch`: each a `Rider`, their answers rows of one batch runner, `engine.decode.shared_batch`), and
requests that come while it runs can join it (`SharedBatch.join`); each then reads its own events
(`rider_events`). Events cross from the model's worker thread to the server's loop through `HANDOFF`, a
thread of its own that calls `call_soon_threadsafe` (why: `Handoff`).
Setting `cancel` (a client gone, the window's Stop) ends the generation before its next token; the stream then
still ends with each choice's `Done` (finish reason "cancelled").
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import cast

from engine.backend import Backend
from engine.engine import Engine
from engine.errors import EngineError
from engine.events import Done, Event
from engine.decode.batch_inbox import BatchInbox
from engine.decode.shared_batch import BatchJob, shared_batch_events
from engine.request import GenerationRequest

log = logging.getLogger(__name__)

_FINISHED = object()  # the worker's job is over (after the last Done, or after an error)


class Handoff:
    """Carries calls from the model's worker thread to a server's event loop, on a thread of its own.

    Why not `loop.call_soon_threadsafe` on the worker: it writes a byte to the loop's self-pipe, that send
    lets go of the GIL, the woken loop takes it, and the model's thread then waits for the loop's whole work
    on the token (its chunk built and sent, the sinks) before it can start the next forward: 2 ms a token
    with llama.cpp on 2 threads on 2 cores (bench/serve.py under py-spy, docs/serve.md "Speed"). `put` is a
    `SimpleQueue.put`, which keeps the GIL; this thread takes it when the worker lets go of it in the forward,
    so the server's work on a token runs while the model computes the next one, as a direct consumer's does.
    Calls for one loop keep their order (one FIFO, one thread); those that came together go as one callback.
    The thread ends after `IDLE_S` with nothing to carry (a stopped server leaves no thread behind) and the
    next call starts it again.
    """

    IDLE_S = 1.0

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, Callable[..., object], tuple[object, ...]]] \
            = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
        """Call `fn(*args)` on `loop` soon, after every call put before it for that loop. Thread-safe.

        Raises RuntimeError, as `call_soon_threadsafe` does, when the loop is closed: the worker's run then ends
        (nobody can read its events) instead of generating on for no one."""
        if loop.is_closed():
            raise RuntimeError(f"the server's event loop is closed: no one reads {getattr(fn, '__qualname__', fn)}")
        with self._lock:  # uncontended but for the moment the idle thread decides to end (see _run)
            self._calls.put((loop, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="logitlab-serve-handoff", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                first = self._calls.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:  # a call put meanwhile is either seen here or starts a new thread
                    if self._calls.empty():
                        self._thread = None
                        return
                continue
            batch = [first]
            while True:
                try:
                    batch.append(self._calls.get_nowait())
                except queue.Empty:
                    break
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Callable[..., object], tuple[object, ...]]]] = {}
            for loop, fn, args in batch:
                by_loop.setdefault(loop, []).append((fn, args))
            for loop, calls in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_call_each, calls)
                except RuntimeError:  # that loop is closed (its server stopped, its answers cancelled): no reader
                    log.debug("dropped %d calls for a closed event loop", len(calls))


def _call_each(calls: list[tuple[Callable[..., object], tuple[object, ...]]]) -> None:
    # Each call on its own, as separate loop callbacks were: one that raises must not drop the events after it
    # (an answer's end among them, which its client waits for).
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:
            log.exception("a served answer's event could not be delivered")


HANDOFF = Handoff()  # one for the process: a thread that sleeps between tokens


@dataclass(eq=False)
class Rider:
    """A served request that can be rows of a shared batch: what the batch runs, and where its events go.

    `cells`: the KV cache positions its rows can fill (its prompt, and `n` answers of `max_new_tokens`); the
    queue is made on the server's loop, where `rider_events` reads it.
    """

    request: GenerationRequest
    n: int
    cancel: threading.Event
    cells: int
    queue: asyncio.Queue[object] = field(default_factory=asyncio.Queue)
    ended: bool = False  # its events are over (read to the end, or its client left): its rows are leaving


@dataclass(eq=False)
class SharedBatch:
    """A batch under way: its riders so far (those that started it, then those that joined), and its inbox."""

    riders: list[Rider]
    inbox: BatchInbox[BatchJob]

    def join(self, rider: Rider) -> bool:
        """Offer `rider` to the running batch; False when it no longer takes newcomers (it waits its turn)."""
        return self.inbox.offer(BatchJob(rider.request, rider.n, rider.cancel),
                                on_accept=lambda: self.riders.append(rider))


def shared_batch(engine: Engine, riders: Sequence[Rider], on_done: Callable[[], None]) -> SharedBatch:
    """Run the riders' answers as one batch on the model's worker; each rider's events go to its queue.

    Requests can `join` the returned batch while it runs. `on_done` is called on the server's loop when the
    batch is over (the model is free again), also when it could not start. Call on the server's loop.
    """
    loop = asyncio.get_running_loop()
    batch = SharedBatch(list(riders), BatchInbox())
    jobs = [BatchJob(r.request, r.n, r.cancel) for r in riders]

    def put(rider: Rider, item: object) -> None:
        HANDOFF.put(loop, rider.queue.put_nowait, item)

    def job(backend: Backend) -> None:
        # A joined job's index is its place in `batch.riders`: both follow the inbox's order of offers.
        for j, row_event in shared_batch_events(backend, jobs, batch.inbox,
                                                others_waiting=lambda: engine.has_queued_work):
            put(batch.riders[j], (row_event.row, row_event.event))

    def finished(fut: Future[None]) -> None:
        # Closed here too, for a batch that never ran (the model closed first): no rider is added after this, and
        # every rider taken so far hears that the batch is over.
        batch.inbox.close()
        if fut.cancelled():  # the model's worker was closed with its queued work cancelled
            outcome: object = EngineError("the model was closed before this answer's turn")
        else:
            outcome = fut.exception() or _FINISHED
        for rider in batch.riders:
            put(rider, outcome)
        HANDOFF.put(loop, on_done)  # after the riders' outcomes, as they were put first

    try:
        future = engine.call(job)
    except RuntimeError as e:  # the model closed while these requests waited their turn
        failed: Future[None] = Future()
        failed.set_exception(EngineError(f"the model was closed before this answer's turn ({e})"))
        finished(failed)
        return batch
    future.add_done_callback(finished)
    return batch


async def rider_events(rider: Rider) -> AsyncIterator[tuple[int, Event]]:
    """The rider's events from its shared batch (as `engine_events` gives them); leaving early ends its rows."""
    try:
        async for item in _drain(rider.queue, rider.n):
            yield item
    finally:
        rider.ended = True
        rider.cancel.set()


async def engine_events(engine: Engine, request: GenerationRequest, n: int,
                        cancel: threading.Event) -> AsyncIterator[tuple[int, Event]]:
    """Every event of the request's `n` choices, each choice ending with its Done; raises the run's error."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[object] = asyncio.Queue()

    def put(item: object) -> None:
        HANDOFF.put(loop, events.put_nowait, item)

    if n == 1:
        try:
            handle = engine.submit(request, lambda event: put((0, event)))
        except RuntimeError as e:  # the model closed while this request waited its turn (another model, quitting)
            raise EngineError(f"the model was closed before this answer's turn ({e})") from None
        # The handle's own event is the one the worker watches: link ours to it.
        watcher = loop.create_task(_link(cancel, handle.cancel_event))
    else:
        from engine.fingerprints.taking import rows_with_fingerprint
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
    try:
        async for item in _drain(events, n):
            yield item
    finally:
        cancel.set()  # leaving early (the client went away): the generation stops before its next token
        if n == 1:
            handle.cancel_event.set()
        if watcher is not None:
            watcher.cancel()


async def _drain(queue: asyncio.Queue[object], n: int) -> AsyncIterator[tuple[int, Event]]:
    """(choice, event) items from a worker's queue until each of the `n` choices had its Done; raises the
    worker's error."""
    left = n
    while left:
        item = await queue.get()
        if item is _FINISHED:
            return
        if isinstance(item, BaseException):
            raise _in_words(item)
        index, event = cast("tuple[int, Event | BaseException]", item)
        if isinstance(event, BaseException):
            raise _in_words(event)
        yield index, event
        if isinstance(event, Done):
            left -= 1


def _in_words(error: BaseException) -> BaseException:
    """The worker's error as the server reports it: ours and a bad value as they are (the client is told their
    words with the right status), anything else (a model's runtime failing mid-batch) as an EngineError
    naming it, so a stream still ends with an error event rather than breaking off."""
    if isinstance(error, (EngineError, ValueError)) or not isinstance(error, Exception):
        return error
    return EngineError(f"the model failed: {type(error).__name__}: {error}")


async def _link(ours: threading.Event, theirs: threading.Event) -> None:
    """Set `theirs` when `ours` is set (polled: a threading.Event has no awaitable)."""
    while not ours.is_set():
        await asyncio.sleep(0.05)
    theirs.set()
