"""Step mode (manual sampling): the answer pauses after each distribution until the user picks a token.

The decode loop calls its `choose` hook with each sampled token's event
(engine/decode/loop.py); `StepGate.choose` shows it to the window (`on_waiting`,
called on the worker thread) and blocks until the window answers with
`pick(token_id)` (None: take the sampler's pick), stepping is switched off
(the model goes on by itself), or the run is cancelled. Cancellation is
checked every `poll_s` while it waits, so Stop still ends the answer at once.

`SteppedEngine` wraps an `Engine` so that `submit` runs the decode loop with
the gate: it has `submit(request, on_event)` like `Engine`, so the chat's
token stream can use it unchanged.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

from engine.backend import Backend
from engine.capabilities import MissingCapabilityError, OwnEvents
from engine.decode.loop import generate_events
from engine.events import Event, TokenEvent
from engine.request import GenerationRequest
from engine.worker import EventCallback, GenerationHandle, deliver


class RunsJobs(Protocol):
    """What step mode needs of an `Engine` (engine.engine): a job run on the model's worker. A protocol, so the
    decode core never imports the engine above it."""

    def call(self, fn: Callable[[Backend], Any]) -> Future[Any]: ...


POLL_S = 0.05


class StepGate:
    """Where the decode thread waits for the user's pick; `stepping` off lets the model go on."""

    def __init__(self, on_waiting: Callable[[TokenEvent], None], poll_s: float = POLL_S) -> None:
        self.on_waiting = on_waiting
        self.poll_s = poll_s
        self._stepping = threading.Event()
        self._picks: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    @property
    def stepping(self) -> bool:
        return self._stepping.is_set()

    def set_stepping(self, on: bool) -> None:
        """Switch step mode; switched off while a token waits, the sampler's pick is taken and the run goes on."""
        if on:
            self._stepping.set()
        else:
            self._stepping.clear()
            self._picks.put(None)

    def pick(self, token_id: int | None) -> None:
        """The user's answer to the waiting distribution: a token id, or None for the sampler's pick."""
        self._picks.put(None if token_id is None else int(token_id))

    def choose(self, preview: TokenEvent, cancel: threading.Event) -> int | None:
        """The decode loop's hook (worker thread): the token to take at `preview`'s position."""
        if not self.stepping:
            return None
        while True:  # picks given before this distribution was shown answer nothing
            try:
                self._picks.get_nowait()
            except queue.Empty:
                break
        self.on_waiting(preview)
        while self.stepping and not cancel.is_set():
            try:
                return self._picks.get(timeout=self.poll_s)
            except queue.Empty:
                continue
        return None


class SteppedEngine:
    """An `Engine` whose generations go through `gate` (its `submit` is the one thing that differs)."""

    def __init__(self, engine: RunsJobs, gate: StepGate) -> None:
        self.engine = engine
        self.gate = gate

    def submit(self, request: GenerationRequest, on_event: EventCallback) -> GenerationHandle:
        handle = GenerationHandle()
        gate = self.gate

        def job(backend: Backend) -> None:
            def events() -> Iterator[Event]:
                if isinstance(backend, OwnEvents):
                    raise MissingCapabilityError(
                        f"step mode needs a model that runs here through the shared decode loop; "
                        f"{backend.info.name} ({backend.info.backend}) makes its own token stream"
                    )
                choose = lambda ev: gate.choose(ev, handle.cancel_event)  # noqa: E731
                return generate_events(backend, request, handle.cancel_event, choose=choose)

            deliver(events, handle, on_event)

        self.engine.call(job)
        return handle
