"""One owner thread per loaded model.

Every call into a backend happens on this thread: MLX streams are
thread-local, torch is happiest without cross-thread use, and the UI thread
must never block on a forward pass. Requests go in through a queue; events
come out through a callback invoked on the worker thread; exceptions travel
as values (mlx-lm `server.py` style) and are re-raised by the consumer.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TypeVar

from engine.backends.base import Backend
from engine.capabilities import MissingCapabilityError, OwnEvents
from engine.decode import generate_events
from engine.events import Done, Event
from engine.request import GenerationRequest

log = logging.getLogger(__name__)
T = TypeVar("T")

# Receives TokenEvent / Done, or the exception that ended the generation.
EventCallback = Callable[["Event | BaseException"], None]


def events_for(backend: Backend, request: GenerationRequest, cancel: threading.Event):
    """The event stream of one request. A backend with its own stream (a server model: server sampling,
    "top N from server" notes) makes it; every other backend runs the shared decode loop."""
    if isinstance(backend, OwnEvents):
        return backend.events(request, cancel)
    if request.server_sampling:
        raise MissingCapabilityError(
            f"server sampling needs a model on a server; {backend.info.name} runs here ({backend.info.backend})"
        )
    return generate_events(backend, request, cancel)


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
        self._thread = threading.Thread(target=self._run, args=(loader,), name=name, daemon=True)
        self._thread.start()

    def _run(self, loader: Callable[[], Backend]) -> None:
        try:
            backend = loader()
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on `ready`
            self.ready.set_exception(e)
            return
        self.ready.set_result(backend)
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
            deliver(lambda: events_for(self.ready.result(), request, handle.cancel_event), handle, on_event)

        self._put(job)
        return handle

    def _put(self, job: Callable[[], None]) -> None:
        if self._closed:
            raise RuntimeError("the model worker is closed")
        self._jobs.put(job)

    def close(self, timeout: float | None = 10.0) -> None:
        """Finish queued work, release the model, end the thread."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join(timeout)


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
