"""Events for one request on a remote model: the worker's single entry point into this package.

- `request.server_sampling`: the server samples (`server_stream`).
- otherwise "we sample": the ordinary decode loop over the backend's forward
  (the server's top N log-probs, -inf elsewhere). Our sampler renormalises
  over those N, as it must to draw from them; the model view does not: the
  decode loop shows the server's log-probs as reported, with a "rest" entry
  (engine/top_n.py, for every model whose `ModelInfo.reports_top_n` is set).

A server error after some tokens ends the run with a Done(finish_reason=
"error") that keeps them, with the run's seed and timings (the decode loop
makes it); a cancel interrupts the request in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.remote.client import cancellable
from engine.backends.remote.errors import ServerError
from engine.backends.remote.server_stream import server_sampled_events
from engine.decode.loop import generate_events
from engine.events import Event
from engine.request import GenerationRequest

if TYPE_CHECKING:
    from engine.backends.remote.backend import RemoteBackend


def remote_events(
    backend: RemoteBackend, request: GenerationRequest, cancel: threading.Event | None = None
) -> Iterator[Event]:
    cancel = cancel or threading.Event()
    if request.server_sampling:
        yield from server_sampled_events(backend, request, cancel)
        return
    backend.require_we_sample()  # before anything is sent: a server we cannot sample on says so in words
    events = generate_events(_Cancellable(backend, cancel), request, cancel, recoverable=(ServerError,))
    try:
        yield from events
    finally:
        events.close()


class _Cancellable:
    """The backend as one run sees it: setting the run's cancel event ends a request in flight at once."""

    def __init__(self, backend: RemoteBackend, cancel: threading.Event) -> None:
        self._backend = backend
        self._cancel = cancel

    def __getattr__(self, name: str) -> Any:  # the backend's own attribute, whatever it is
        return getattr(self._backend, name)

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        with cancellable(self._cancel):
            return self._backend.forward(token_ids)
