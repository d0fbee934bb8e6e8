"""One owner thread per loaded model.

Every call into a backend happens on this thread: MLX streams are
thread-local, torch is happiest without cross-thread use, and the UI thread
must never block on a forward pass. Requests go in through a queue; events
come out through a callback invoked on the worker thread; exceptions travel
as values (mlx-lm `server.py` style) and are re-raised by the consumer.
"""

from __future__ import annotations

import atexit
import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TypeVar

from engine import background_threads
from engine.backend import Backend
from engine.background_threads import BackgroundThread
from engine.capabilities import MissingCapabilityError, OwnEvents
from engine.decode.loop import generate_events
from engine.events import Done, Event
from engine.fingerprints.taking import with_fingerprint
from engine.request import GenerationRequest
from engine.steering.apply import steer_for_request

log = logging.getLogger(__name__)
T = TypeVar("T")

# Receives TokenEvent / Done, or the exception that ended the generation.
EventCallback = Callable[["Event | BaseException"], None]

# How long closing with `cancel=True` (Ctrl-C, the window closing) waits for the thread before leaving it:
# a cancelled generation stops before its next token, well within this; a load or a connection that
# cannot be interrupted is left to finish on its own (the thread then releases the model itself).
CANCEL_WAIT_S = 0.5

# Every worker whose thread may still run, so that interpreter exit can stop them (see `stop_all`).
_live_workers: "weakref.WeakSet[ModelWorker]" = weakref.WeakSet()


def events_for(backend: Backend, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
    """The event stream of one request. A backend with its own stream (a server model: server sampling,
    "top N from server" notes) makes it; every other backend runs the shared decode loop."""
    if isinstance(backend, OwnEvents):
        steer_for_request(backend, request.steering)  # a server cannot steer: refused in words
        return with_fingerprint(backend, request, backend.events(request, cancel))
    if request.server_sampling:
        raise MissingCapabilityError(
            f"server sampling needs a model on a server; {backend.info.name} runs here ({backend.info.backend})"
        )
    return with_fingerprint(backend, request, generate_events(backend, request, cancel))


class GenerationHandle:
    """A submitted generation: cancel it, or wait for its final stats."""

    def __init__(self) -> None:
        self.cancel_event = threading.Event()
        self.result: Future = Future()  # GenerationStats, or the exception

    def cancel(self) -> None:
        """Stop before the next token (or before starting, if still queued)."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


class ModelWorker:
    def __init__(self, loader: Callable[[], Backend], name: str = "logitlab-model"):
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.ready: Future[Backend] = Future()
        self._closed = False
        self._cancelled = False  # closed with cancel=True: queued and running work ends early
        self._handles: set[GenerationHandle] = set()  # generations queued or running (cancelled on close)
        self._lock = threading.Lock()
        # A daemon: a load that cannot be interrupted must not keep the process alive after Ctrl-C; and
        # stoppable, so that it is never left inside a backend while the interpreter exits (`stop_all`).
        self._thread = BackgroundThread(functools.partial(self._run, loader), name=name)
        _live_workers.add(self)
        self._thread.start()

    def _run(self, loader: Callable[[], Backend]) -> None:
        try:
            backend = loader()
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on `ready`
            self.ready.set_exception(e)
            return
        self.ready.set_result(backend)
        # A chat is what usually follows a load: its template renders in the renderer process, started
        # now in the background so that the first send does not wait for it.
        from engine.templates import process as template_process

        template_process.prestart()
        while (job := self._jobs.get()) is not None:
            job()
        try:
            backend.close()
        except Exception:  # closing must not raise into nothing
            log.exception("closing the backend failed")

    def wait_ready(self, timeout: float | None = None) -> Backend:
        return self.ready.result(timeout)

    def call(self, fn: Callable[[Backend], T]) -> Future[T]:
        """Run `fn(backend)` on the worker thread (after queued work)."""
        fut: Future[T] = Future()

        def job() -> None:
            if self._cancelled:
                fut.cancel()
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(self.ready.result()))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

        self._put(job)
        return fut

    def submit(self, request: GenerationRequest, on_event: EventCallback) -> GenerationHandle:
        """Queue a generation; `on_event` is called on the worker thread for every event."""
        handle = GenerationHandle()

        def job() -> None:
            try:
                deliver(lambda: events_for(self.ready.result(), request, handle.cancel_event), handle, on_event)
            finally:
                with self._lock:
                    self._handles.discard(handle)

        with self._lock:
            self._handles.add(handle)
        self._put(job)
        return handle

    def _put(self, job: Callable[[], None]) -> None:
        if self._closed:
            raise RuntimeError("the model worker is closed")
        self._jobs.put(job)

    def close(self, timeout: float | None = 10.0, *, cancel: bool = False) -> bool:
        """End the thread after queued work and release the model; True when the thread has ended.

        `cancel=True` (Ctrl-C, the window closing) cancels every queued and running generation and
        call first, and waits at most `min(timeout, CANCEL_WAIT_S)`: a thread still busy after that (a
        load, a connection, a forward that cannot be interrupted) is left to finish as a daemon, and
        releases the model itself when it does. Called again, it waits again (and may cancel).
        """
        if cancel:
            self._cancel_all()
            timeout = CANCEL_WAIT_S if timeout is None else min(timeout, CANCEL_WAIT_S)
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        ended = not self._thread.is_alive()
        if not ended and cancel:
            log.info("the model thread is still busy (loading or inside a call); leaving it to end on its own")
        return ended

    @property
    def has_queued_work(self) -> bool:
        """Whether work waits behind what runs now (a running batch then stops taking newcomers)."""
        return not self._jobs.empty()

    @property
    def busy(self) -> bool:
        """Whether the thread still runs (loading, working, or releasing the model)."""
        return self._thread.is_alive()

    def _cancel_all(self) -> None:
        self._cancelled = True
        with self._lock:
            handles = list(self._handles)
        for handle in handles:
            handle.cancel()


def close_all(timeout: float = CANCEL_WAIT_S) -> bool:
    """Cancel and close every model worker of this process, waiting at most `timeout` s; True when all ended.

    For an app that quits (its window closed, Ctrl-C): queued and running work is cancelled (a
    generation stops before its next token) and each model is released on its own thread. A worker
    still loading has nothing to cancel and is not waited for: it releases its model when the load ends.
    """
    deadline = time.monotonic() + timeout
    workers = list(_live_workers)
    for worker in workers:
        worker._cancel_all()
        worker.close(timeout=0)
    for worker in workers:
        if worker.ready.done():
            worker._thread.join(max(0.0, deadline - time.monotonic()))
    return not any(worker.busy for worker in workers)


def stop_all(timeout: float = background_threads.EXIT_WAIT_S) -> bool:
    """End every model worker (and every other engine background thread) of this process; True when all ended.

    `close_all` first (cancelled work gets `CANCEL_WAIT_S` to end); a thread still busy after that (a
    load, a call without a cancel, a forward) is stopped at its next Python line
    (`engine.background_threads`), waiting at most `timeout` s in all. Run at interpreter exit, so
    that no thread is left inside a backend's native code while the interpreter and the libraries'
    globals are torn down: that is how a process ends in `terminate called without an active exception`.
    """
    deadline = time.monotonic() + timeout
    close_all(min(timeout, CANCEL_WAIT_S))
    return background_threads.stop_all(max(0.0, deadline - time.monotonic()))


def busy_workers() -> list[str]:
    """The names of worker threads still running (for a caller deciding how to exit)."""
    return [worker._thread.name for worker in list(_live_workers) if worker.busy]


atexit.register(stop_all)


def deliver(make_events: Callable[[], Iterable[Event]], handle: GenerationHandle, on_event: EventCallback) -> None:
    """Hand every event `make_events()` yields to `on_event`, and the run's end (stats or error) to `handle`.

    A consumer that fails (a closed event loop, a deleted window) cancels the run; an error of the run
    itself reaches the consumer as an event and `handle.result` as its exception.
    """
    try:
        for event in make_events():
            try:
                on_event(event)
            except Exception:
                log.debug("event consumer failed; cancelling", exc_info=True)
                handle.cancel()
            if isinstance(event, Done):
                handle.result.set_result(event.stats)
    except BaseException as e:  # noqa: BLE001 - re-raised on the consumer side
        handle.result.set_exception(e)
        try:
            on_event(e)
        except Exception:
            log.debug("event consumer failed while receiving an error", exc_info=True)
