"""N continuations from one prefix: siblings that share the prefix's KV cache and decode as one batch.

The loom's "N continuations here": from a prompt (and the kept part of an
answer, `request.assistant_prefix`), N children, each drawn by its own
`SamplerChain` seeded `seed + row` (so a child does not depend on which other
children share its batch); in "top" mode, child r starts with the model's
r-th most likely next token and goes on with its own chain; in "beam" mode the
children are the N most likely continuations as a whole, found by beam search
(`engine.research.beam`, transformers' algorithm: width N, length-normalised
scores) over the model's own distribution, then run through the rows with
their tokens forced, so each token is recorded and inspectable like a drawn
one (and says it was forced).

Where the model can run a batch (`engine.capabilities.BatchRunners`), the
prefix is computed once for one row, the row is copied N times with the
runner's `reorder` (llama.cpp shares the cache cells, torch and MLX copy the
tensors: either way the prefix is not recomputed), and then every step is one
forward for all rows still running; a row that ends is dropped from the batch
by another `reorder`. A model with its own event stream (a server) or without
a batch runner runs the children one after another through the ordinary
decode loop (a server's own prefix cache makes the repeated prompt cheap),
except where the server samples and can draw all N in one request (its `n`:
`engine.capabilities.ServerChildren`; every child then reports that request's
seed). Banned strings need the decode loop's step-backs, so they also take that way.

Each batched row is the decode loop's own per-row object (`AnswerRow`,
engine/decode/row.py: history, detokenizer, stops, end of sequence, the
record its stats come from), so a row's events and stats are the ones the
single-answer loop makes with the row's seed (tests/engine/test_decode_core.py).
Events are `RowEvent(row, event)`: per row, `TokenEvent`s, then one `Done`.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from engine.backend import Backend
from engine.capabilities import (
    BatchRunner, BatchRunners, OwnEvents, RecordsCacheSchedule, ServerChildren, StartsFromBackendCache,
)
from engine.decode.loop import check_context, generate_events, prompt_ids_for
from engine.decode.row import AnswerRow
from engine.decode.stats import generation_stats
from engine.decode.batch_loop import RowEvent, decode_rows
from engine.events import Done, Event, FinishReason, GenerationStats, TokenEvent
from engine.request import GenerationRequest
from engine.tokenizer import TokenizerLike

if TYPE_CHECKING:
    from engine.research.beam import BeamRunner

log = logging.getLogger(__name__)

MIN_CHILDREN, MAX_CHILDREN = 2, 16
# sample: each row draws with its own seed; top: row r starts with the r-th likeliest token; beam: the N likeliest
# continuations (beam search over the model's distribution; the sampler's settings do not choose them)
Mode = Literal["sample", "top", "beam"]
MODES = ("sample", "top", "beam")


def check_children(n: int) -> None:
    """ValueError in words when `n` is not a number of children the loom makes."""
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_CHILDREN <= n <= MAX_CHILDREN:
        raise ValueError(f"N continuations: N must be a whole number from {MIN_CHILDREN} to {MAX_CHILDREN}, got {n!r}")


def row_seeds(request: GenerationRequest, n: int) -> list[int]:
    """Each row's seed: the request's seed (or a fresh one) plus the row number, kept below 2**63."""
    base = request.sampler.seed if request.sampler.seed is not None else secrets.randbits(62)
    return [(base + r) % 2**63 for r in range(n)]


def continuation_events(
    backend: Backend,
    request: GenerationRequest,
    n: int,
    *,
    mode: Mode = "sample",
    cancel: threading.Event | None = None,
) -> Iterator[RowEvent]:
    """N children of `request`'s prompt (plus assistant prefix); yields RowEvents, every row ending with one Done.

    `request.forced_tokens` is not allowed (each child chooses its own first token). Runs on the backend's
    worker thread.

    Raises:
        ValueError: `n` outside 2..16, an unknown mode, or forced tokens given.
        ContextLengthError: the prompt and `max_new_tokens` do not fit the model's context.
    """
    check_children(n)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if request.forced_tokens:
        raise ValueError("N continuations choose their own first tokens: give no forced tokens")
    if request.constraint is not None and mode != "sample":
        raise ValueError("the N most likely are the model's, not the structured output's: "
                         "sample the continuations, or turn the structured output off")
    if mode == "beam":
        _check_beam(backend, request)
    cancel = cancel or threading.Event()
    seeds = row_seeds(request, n)
    if mode == "sample" and request.server_sampling and isinstance(backend, ServerChildren):
        # The server samples: one request asks it for all N children (its `n`), one by one where it cannot.
        yield from (RowEvent(row, event) for row, event in backend.children_events(request, seeds, cancel))
    elif not runs_in_batch(backend, request):
        yield from _one_after_another(backend, request, seeds, mode, cancel)
    else:
        yield from _batched(backend, request, seeds, mode, cancel)


def runs_in_batch(backend: Backend, request: GenerationRequest) -> bool:
    """Whether `request`'s answers can be rows of one of `backend`'s batch runners (`decode_rows`).

    The batched rows run the sampler chain alone: banned strings (a step back) and a constraint (a matcher per
    row) live in the decode loop, and so does steering (the batch runners' contexts carry no control vector);
    a model with its own event stream (a server) or without batch runners has no batch to share.
    """
    if isinstance(backend, OwnEvents) or not isinstance(backend, BatchRunners):
        return False
    steered = request.steering is not None and request.steering.active
    return not (request.sampler.banned_strings or request.constraint is not None or steered)


def _check_beam(backend: Backend, request: GenerationRequest) -> None:
    """ValueError in words when beam search cannot make this request's children."""
    if request.sampler.banned_strings:
        raise ValueError("beam search ranks the model's own continuations and cannot step back from banned "
                         "strings: sample the continuations, or clear the banned strings")
    if request.steering is not None and request.steering.active:
        raise ValueError("beam search runs on the model's batch runner, which carries no control vector: sample "
                         "the continuations, or set the steering strengths to 0")
    if isinstance(backend, OwnEvents) or not isinstance(backend, BatchRunners):
        raise ValueError(f"beam search needs the model's whole next-token distribution for N rows at once, which "
                         f"{backend.info.name} does not give here: choose own seeds or the most likely first tokens")


def _beams(runner: BatchRunner, prompt: list[int], n: int, request: GenerationRequest, tok: TokenizerLike,
           context_length: int,
           cancel: threading.Event) -> list[list[int]] | None:
    """The N best continuations' tokens, best first (None: cancelled during the search)."""
    from engine.research.beam import beam_search

    eos = () if request.ignore_eos else sorted(tok.eos_token_ids)
    searched: BeamRunner = _PromptFromBackendCache(runner) if isinstance(runner, StartsFromBackendCache) else runner
    found = beam_search(searched, prompt, num_beams=n, num_return_sequences=n, max_new_tokens=request.max_new_tokens,
                        eos_token_ids=eos, pad_id=runner.pad_id, context_length=context_length,
                        cancelled=cancel.is_set)
    return [list(b.generated) for b in found] or None


class _CachedBatchRunner(BatchRunner, StartsFromBackendCache, Protocol):
    """A batch runner that can begin a row from the backend's cache."""


class _PromptFromBackendCache:
    """A batch runner whose `start` of one prompt begins from the backend's cache (StartsFromBackendCache)."""

    def __init__(self, runner: _CachedBatchRunner) -> None:
        self._runner = runner
        self.step, self.reorder = runner.step, runner.reorder
        self.pad_id = runner.pad_id

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        if len(prompts) != 1:
            return self._runner.start(prompts)
        return self._runner.start_from_backend_cache(prompts[0])[0]


def _row_request(request: GenerationRequest, seed: int, first: int | None) -> GenerationRequest:
    return replace(request, sampler=request.sampler.with_(seed=seed), forced_tokens=() if first is None else (first,))


def _events(backend: Backend, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
    if isinstance(backend, OwnEvents):
        return backend.events(request, cancel)
    return generate_events(backend, request, cancel)


def _one_after_another(
    backend: Backend, request: GenerationRequest, seeds: list[int], mode: Mode, cancel: threading.Event
) -> Iterator[RowEvent]:
    """Each child through the ordinary decode loop; the backend's prefix reuse keeps the shared prompt cached."""
    firsts: list[int | None] = [None] * len(seeds)
    if mode == "top":
        # One greedy token tells the likeliest first tokens (a cached prompt makes it one forward).
        probe = replace(request, max_new_tokens=1, top_n=max(request.top_n, len(seeds)),
                        sampler=request.sampler.with_(temperature=0.0))
        top = next((e.top_model for e in _events(backend, probe, cancel) if isinstance(e, TokenEvent)), ())
        likeliest: list[int | None] = [t.token_id for t in top if not t.is_rest]
        firsts = likeliest[: len(seeds)]
        firsts += [None] * (len(seeds) - len(firsts))  # fewer reported than asked: the rest sample
    for row, seed in enumerate(seeds):
        if cancel.is_set():
            yield RowEvent(row, Done(_empty_stats(seed, "cancelled")))
            continue
        for event in _events(backend, _row_request(request, seed, firsts[row]), cancel):
            yield RowEvent(row, event)


def _empty_stats(seed: int, finish: FinishReason, prompt_tokens: int = 0) -> GenerationStats:
    return generation_stats(finish=finish, prompt_tokens=prompt_tokens, seed=seed)


def _batched(
    backend: Backend, request: GenerationRequest, seeds: list[int], mode: Mode, cancel: threading.Event
) -> Iterator[RowEvent]:
    """All children as rows of one batch runner: the prefix once, then one forward per step for every live row."""
    tok = backend.tokenizer
    t0 = time.perf_counter()
    prompt = prompt_ids_for(tok, request)
    check_context(len(prompt), request.max_new_tokens, backend.info.context_length)
    rows = [AnswerRow.start(backend, request, prompt, t0, seed=s) for s in seeds]
    n = len(rows)
    reused = 0  # the prompt's tokens taken from the backend's cache rather than computed
    schedule: tuple[tuple[int, int], ...] = ()  # the calls the shared prompt was computed in, where the runner says

    def done(r: int) -> RowEvent:
        # The first row computed the prefix (but what the backend had cached); the others share it.
        stats = rows[r].stats(reused_tokens=len(prompt) if r else reused, peak_memory_bytes=backend.peak_memory_bytes(),
                              cache_schedule=schedule)
        return RowEvent(r, Done(stats))

    if cancel.is_set():
        for r in range(n):
            rows[r].end("cancelled")
            yield done(r)
        return
    assert isinstance(backend, BatchRunners)  # continuation_events sends only such models here
    runner = backend.batch_runner()
    try:
        forced: list[list[int]] | None = None  # beam mode: each row's tokens, chosen by the search
        if mode == "beam":
            forced = _beams(runner, prompt, n, request, tok, backend.info.context_length, cancel)
            if forced is None:
                for r in range(n):
                    rows[r].end("cancelled")
                    yield done(r)
                return
            for row, beam in zip(rows, forced):
                row.max_new_tokens = len(beam)  # a beam ends where the search ended it
        if isinstance(runner, StartsFromBackendCache):  # the prompt's start from the chat's own cache
            logits, reused = runner.start_from_backend_cache(prompt)
        else:
            logits = runner.start([prompt])  # (1, V): the shared prefix, computed once
        if isinstance(runner, RecordsCacheSchedule):  # an audit reruns each row with its prompt computed alike
            schedule = runner.cache_schedule(len(prompt))
        firsts: list[int | None] = [None] * n
        if mode == "top":
            order = np.argsort(-logits[0], kind="stable")[:n]  # the model's likeliest first tokens, best first
            firsts = [int(t) for t in order]
        runner.reorder([0] * n)  # N rows over the one prefix
        logits = np.repeat(logits, n, axis=0)  # (N, V)

        def force(r: int, row: AnswerRow) -> int | None:
            if forced is not None:
                return forced[r][row.step]
            return firsts[r] if row.step == 0 else None

        yield from decode_rows(runner, rows, logits, force=force, stopped=lambda r: cancel.is_set(), done=done)
    finally:
        runner.close()
    log.debug("%d continuations: %d forward calls", n, runner.forward_calls)


def collect(events: Sequence[RowEvent] | Iterator[RowEvent], n: int) -> tuple[list[list[TokenEvent]], list[GenerationStats | None]]:
    """Each row's TokenEvents and final stats from a stream of RowEvents (for scripts and tests)."""
    tokens: list[list[TokenEvent]] = [[] for _ in range(n)]
    stats: list[GenerationStats | None] = [None] * n
    for e in events:
        if isinstance(e.event, Done):
            stats[e.row] = e.event.stats
        else:
            tokens[e.row].append(e.event)
    return tokens, stats
