"""Events for one request on a remote model: the worker's single entry point into this package.

- `request.server_sampling`: the server samples (`server_stream`).
- otherwise "we sample": the ordinary decode loop over the backend's forward
  (the server's top N log-probs, -inf elsewhere). Our sampler renormalises
  over those N, as it must to draw from them; the model view must not. So
  each event's model side (`logprob`, `top_model`, `entropy`) is rewritten
  here to the server's log-probs as reported, plus a "rest" entry holding
  the probability the server did not report, and every stage snapshot is
  noted with what it was renormalised over.

A server error after some tokens ends the run with a Done(finish_reason=
"error") that keeps them, with the run's seed and timings (the decode loop
makes it); a cancel interrupts the request in flight.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from engine.backends.remote.client import cancellable
from engine.backends.remote.errors import ServerError
from engine.backends.remote.server_stream import server_sampled_events
from engine.decode import generate_events
from engine.events import Event, TokenEvent, TokenProb, rest_entry
from engine.request import GenerationRequest


def remote_events(backend, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[Event]:
    cancel = cancel or threading.Event()
    if request.server_sampling:
        yield from server_sampled_events(backend, request, cancel)
        return
    backend.require_we_sample()  # before anything is sent: a server we cannot sample on says so in words
    run = _OneRun(backend, cancel)
    events = generate_events(run, request, cancel, recoverable=(ServerError,))
    try:
        for event in events:
            if isinstance(event, TokenEvent) and run.last is not None:
                event = model_view(event, run.last, backend.top_n)
            yield event
    finally:
        events.close()


class _OneRun:
    """The backend as one run sees it: every forward can be cancelled, and the latest step's reported
    log-probs are kept (the decode loop yields a step's event before it calls forward again)."""

    def __init__(self, backend, cancel: threading.Event):
        self._backend = backend
        self._cancel = cancel
        self.last: np.ndarray | None = None  # (V,) the server's log-probs as reported, -inf where unreported

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        with cancellable(self._cancel):
            self.last = self._backend.forward(token_ids)
        return self.last


def model_view(event: TokenEvent, reported: np.ndarray, top_n: int) -> TokenEvent:
    """`event` with its model side as the server reported it: log-probs not renormalised, a "rest" entry for the
    unreported probability, the entropy of reported + rest (a lower bound of the model's), stage notes saying
    what the sampler renormalised over."""
    lps = reported[np.isfinite(reported)].astype(np.float64)
    if lps.size == 0:
        return event
    mass = float(np.exp(lps).sum())
    shift = math.log(mass)  # the chain's log_softmax subtracted this from every reported log-prob
    rest = rest_entry(mass)
    probs = np.exp(lps)
    entropy = float(-(probs * lps).sum()) + (-math.exp(rest.logprob) * rest.logprob if rest else 0.0)
    top = tuple(dataclasses.replace(p, logprob=p.logprob + shift) for p in event.top_model)
    note = (f"top {top_n} from server, renormalised over them: they hold {min(mass, 1.0):.1%} "
            "of the model's probability (the rest was not reported)")
    stages = None
    if event.stages is not None:
        stages = tuple(dataclasses.replace(s, note=note) for s in event.stages)
    return dataclasses.replace(
        event,
        logprob=event.logprob + shift,
        top_model=top + ((rest,) if rest else ()),
        entropy=max(entropy, 0.0),
        stages=stages,
    )


def rest_of(alternatives: Sequence[TokenProb]) -> TokenProb | None:
    """The "rest" entry for a position whose reported alternatives are `alternatives`."""
    return rest_entry(sum(math.exp(p.logprob) for p in alternatives if not p.is_rest))
