"""N server-sampled continuations in ONE streamed request: the OpenAI API's `n` (the loom's N children).

One request, `n` = N: the server computes the prompt once and samples the N
children side by side; its chunks carry `choices[i].index` and are routed to
child i by the same reader as a single answer (`server_stream.
server_choice_events`), so every child's TokenEvents are built as a single
answer's are.

Seeds: one request has one seed. Every child made this way reports the
request's seed (`seeds[0]`, the loom's base seed); the server draws the N
children from it, so a child is "choice r of the request with that seed", not
"the request with seed + r" as on a local model (the loom records r with each
child).

Which servers honour `n` (read in their sources and docs):
- vLLM and SGLang stream one chunk per choice, interleaved, each with its index.
- llama.cpp's server (recent builds) takes `n` as an alias of its `n_cmpl`, at
  most its `--parallel` slots, and refuses more; older builds refused any
  `n` other than 1 ("Only one completion choice is allowed").
- llama-cpp-python's server and Ollama have no `n` in their request types and
  answer one choice; LM Studio's documentation does not list `n`.

So the answer is found out at run time: a server that answers choice 0 only
ignored `n` (that answer is the first child: nothing is lost), and one that
refuses the request (an HTTP error before any token) did not take it. Either
way the children it did not make run one request each, child r with
`seeds[r]` (as the loom does on any model without a batch), with a log line
saying why, and the connection remembers (`caps.many_choices`) so the next
run asks one child at a time from the start.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from engine.backends.remote.errors import ServerResponseError
from engine.backends.remote.server_stream import server_choice_events, server_sampled_events
from engine.decode.stats import generation_stats
from engine.events import Done, Event
from engine.request import GenerationRequest

if TYPE_CHECKING:
    from engine.backends.remote.backend import RemoteBackend

log = logging.getLogger(__name__)


def children_events(
    backend: RemoteBackend, request: GenerationRequest, seeds: Sequence[int], cancel: threading.Event
) -> Iterator[tuple[int, Event]]:
    """(child, event) for children 0..len(seeds)-1 of a server-sampled `request`, each ending with one Done."""
    n = len(seeds)
    host = backend.client.options.host
    if backend.caps.many_choices is False:
        yield from _one_by_one(backend, request, seeds, range(n), cancel)
        return
    first = dataclasses.replace(request, sampler=request.sampler.with_(seed=seeds[0]))
    ended: set[int] = set()
    try:
        for child, event in server_choice_events(backend, first, cancel, n=n):
            if isinstance(event, Done):
                ended.add(child)
            yield child, event
    except ServerResponseError as e:
        # Refused before any token: `n` is the likely cause. It is remembered only once the same request
        # without `n` goes through (if that fails too, its error is the one the user reads).
        log.info("%s refused %d choices in one request (%s): the children go one request each", host, n, e)
        later = _one_by_one(backend, request, seeds, range(n), cancel)
        head = next(later, None)
        _remember(backend, False)
        if head is not None:
            yield head
        yield from later
        return
    missing = [r for r in range(n) if r not in ended]
    if not missing:
        _remember(backend, True)
        return
    if ended == {0}:
        log.info("%s ignores n (asked for %d choices, it streamed one): the other children go one request each",
                 host, n)
        _remember(backend, False)
    else:
        log.info("%s streamed %d of the %d choices asked for: children %s go one request each",
                 host, len(ended), n, ", ".join(map(str, missing)))
    yield from _one_by_one(backend, request, seeds, missing, cancel)


def _one_by_one(
    backend: RemoteBackend, request: GenerationRequest, seeds: Sequence[int], rows: Iterable[int],
    cancel: threading.Event,
) -> Iterator[tuple[int, Event]]:
    """Child r as its own streamed request with seed `seeds[r]`."""
    for r in rows:
        if cancel.is_set():
            yield r, Done(generation_stats(finish="cancelled", prompt_tokens=0, seed=seeds[r]))
            continue
        row = dataclasses.replace(request, sampler=request.sampler.with_(seed=seeds[r]))
        for event in server_sampled_events(backend, row, cancel):
            yield r, event


def _remember(backend: RemoteBackend, works: bool) -> None:
    """What this connection's server does with `n`, for the next loom run on it."""
    if backend.caps.many_choices is not works:
        backend.caps = dataclasses.replace(backend.caps, many_choices=works)
