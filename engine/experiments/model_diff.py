"""Two models, one text: per-token KL, log-probs and ranks (same tokenizer), or per byte span (different ones).

    with Engine.load() as a, Engine.load(backend="torch") as b:   # the Q4 GGUF and its float32 twin
        diff = compare_models(a, b, text)
        print(diff.summary(), diff.top_divergences(5))

How it runs (same tokenizer). Each model scores the text on its own worker
thread with its own position runner (engine.capabilities.PositionRunners: the
text in chunks of positions, every position's logits kept), chunk for chunk. A's
thread turns each chunk into log-probs and its own numbers (`own_stats`) and
hands the chunk over a one-slot queue; B's thread does the same for its chunk
and then, holding both (n, V) blocks, computes KL both ways and the cross ranks
(`cross_stats`). So a full-vocabulary row never leaves the two worker threads,
is never copied between them (the queue passes a reference), and at most about
three chunks per model are alive at once. The two models take turns at the
forwards (one lock), while each chunk's numbers are computed beside the other
model's forward: each backend's forward already uses the machine's cores.

Different tokenizers: each model scores its own tokenization (`score_ids`, one
after the other), and the two are aligned on byte offsets (model_diff_vocab.py).

Either model is an `Engine`, a research `LanguageModel`, or anything with
`call(fn) -> Future` running `fn(backend)` on the thread that owns the model
(`BackendThread` wraps a bare backend).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np

from engine.backend import Backend
from engine.backends.chunks import positions_per_chunk
from engine.capabilities import PositionRunner, PositionRunners, require
from engine.experiments.batch_score import pair_ids
from engine.experiments.model_diff_stats import OwnStats, cross_stats, own_stats
from engine.experiments.model_diff_types import ModelDiff, PositionDiff, SpanDiff, SpanModelDiff
from engine.experiments.model_diff_vocab import aligned_spans, compare_vocabularies, token_spans
from engine.experiments.score import ScoredToken, ScoreResult, _checked_ids, score_ids, text_ids
from engine.sampling.alternatives import TokenNames

log = logging.getLogger(__name__)

T = TypeVar("T")
HANDOFF_WAIT_S = 0.2  # how often a thread waiting on the other checks whether to give up
DIFF_CHUNK_SHARE = 2  # positions per chunk: half the scoring chunk (128 at 49k), so the two threads overlap more


class ModelThread(Protocol):
    """A loaded model and the one thread its work runs on (`Engine`, `LanguageModel`, `BackendThread`)."""

    def call(self, fn: Callable[[Backend], T]) -> Future[T]: ...


class BackendThread:
    """A bare backend with a thread of its own (scripts and tests that hold a backend, not an `Engine`).

    Nothing else may use the backend while a comparison runs on it. `close()` ends the thread, not the backend.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logitlab-model-diff")

    def call(self, fn: Callable[[Backend], T]) -> Future[T]:
        return self._pool.submit(fn, self.backend)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "BackendThread":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _on_thread(model: Any) -> ModelThread:
    if callable(getattr(model, "call", None)):
        return model
    if isinstance(model, Backend) or hasattr(model, "forward"):
        raise TypeError("compare_models takes an Engine or a LanguageModel (a bare backend: wrap it in "
                        "BackendThread(backend) so its work has a thread)")
    raise TypeError(f"compare_models takes an Engine or a LanguageModel, got {type(model).__name__}")


def _backend_of(thread: ModelThread) -> Backend:
    return thread.call(lambda b: b).result()


def _name(backend: Backend) -> str:
    info = backend.info
    return f"{info.name} ({info.backend}{', ' + info.quantization if info.quantization else ''}" \
           f"{', ' + info.dtype if info.dtype and not info.quantization else ''})"


def compare_models(
    a: Any,
    b: Any,
    text: str | None = None,
    *,
    context: str | None = None,
    continuation: str | None = None,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
    take_turns: bool = True,
) -> ModelDiff | SpanModelDiff:
    """Score `text` (or `continuation` after `context`) under models `a` and `b` and compare them.

    Same vocabulary (every id the same bytes): a `ModelDiff`, token by token, with KL of the full
    distributions. Otherwise a `SpanModelDiff` on byte-aligned spans (KL per token is not defined there).
    Blocks until both models are done; call it off the models' threads (and off a UI thread).

    `take_turns` (default): the two models' forwards run one at a time, each chunk's numbers overlapping
    the other model's forward. Each backend already spreads a forward over the machine's cores, and two at
    once on the same cores wait on each other's thread barriers: on a 2-core machine the two at once took
    twice as long as one after the other (bench/model_diff.py). False runs them at the same time (two
    models on two devices).

    Raises:
        ValueError: no text, or a text of fewer than two tokens; a tokenizer that does not spell the text.
        MissingCapabilityError: a model without a position runner (a server reports only its top N).
        ContextLengthError: the text is longer than a model's context.
    """
    if text is None and continuation is None:
        raise ValueError("give a text to compare the models on (or a context and a continuation)")
    if text is not None and (context is not None or continuation is not None):
        raise ValueError("give either a text or a context and a continuation, not both")
    ta, tb = _on_thread(a), _on_thread(b)
    started = time.perf_counter()
    backend_a, backend_b = _backend_of(ta), _backend_of(tb)
    if ta is tb or backend_a is backend_b:  # one thread cannot run both sides at once (they wait on each other)
        raise ValueError("models A and B are the same loaded model; to compare a model with itself, load it twice")
    vocab = compare_vocabularies(backend_a.tokenizer, backend_b.tokenizer)

    def ids_for(tok: Any) -> tuple[list[int], int]:
        if text is not None:
            return text_ids(tok, text)
        return pair_ids(tok, context or "", continuation or "")

    if vocab.same:
        ids, ctx = ids_for(backend_a.tokenizer)
        positions, calls = _token_by_token(ta, tb, backend_a.tokenizer, ids, ctx, top_n, cancelled, take_turns)
        return ModelDiff(_name(backend_a), _name(backend_b), tuple(ids), ctx, tuple(positions), vocab,
                         time.perf_counter() - started, calls)
    full = text if text is not None else (context or "") + (continuation or "")
    if text is None and context:
        raise ValueError(f"the two models' tokenizers differ ({vocab.reason}); compare a whole text, not a "
                         "context and a continuation, so both read the same bytes")
    ids_a, ctx_a = ids_for(backend_a.tokenizer)
    ids_b, ctx_b = ids_for(backend_b.tokenizer)
    spans_a = token_spans(backend_a.tokenizer, ids_a, full, f"model A's tokenizer ({backend_a.info.name})")
    spans_b = token_spans(backend_b.tokenizer, ids_b, full, f"model B's tokenizer ({backend_b.info.name})")
    fa = ta.call(lambda bk: score_ids(bk, ids_a, context=ctx_a, top_n=0, cancelled=cancelled))
    if take_turns:
        fa.result()  # B starts once A is done (see take_turns)
    fb = tb.call(lambda bk: score_ids(bk, ids_b, context=ctx_b, top_n=0, cancelled=cancelled))
    ra, rb = fa.result(), fb.result()
    spans = _span_diffs(full, spans_a, spans_b, ra, rb, backend_a.tokenizer, backend_b.tokenizer)
    return SpanModelDiff(_name(backend_a), _name(backend_b), full, tuple(spans), vocab, len(ids_a), len(ids_b),
                         time.perf_counter() - started)


# --- same tokenizer: one pass per model, KL where both rows are ---------------------------------


class _Stop(Exception):
    """The other side gave up (failed or cancelled): stop quietly."""


def _put(q: queue.Queue, item: object, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            q.put(item, timeout=HANDOFF_WAIT_S)
            return
        except queue.Full:
            continue


def _get(q: queue.Queue, stop: threading.Event) -> Any:
    while True:
        try:
            return q.get(timeout=HANDOFF_WAIT_S)
        except queue.Empty:
            if stop.is_set():
                raise _Stop from None


_END = object()


def _scoring_blocks(backend: Backend, ids: list[int], ctx: int, purpose: str
                    ) -> tuple[PositionRunner, Generator[np.ndarray, None, None]]:
    """(runner, generator of (n, V) logits chunks of positions ctx-1..T-2) on `backend`'s thread."""
    _checked_ids(backend, ids, ctx)
    runner = require(backend, PositionRunners, purpose).position_runner(len(ids))
    chunk = max(1, positions_per_chunk(backend.info.vocab_size) // DIFF_CHUNK_SHARE)
    return runner, runner.position_logits(ids[:-1], first=ctx - 1, chunk=chunk)


def _close_runner(runner: Any) -> None:
    close = getattr(runner, "close", None)  # llama.cpp: its scoring context
    if close is not None:
        close()


def _token_by_token(
    ta: ModelThread, tb: ModelThread, tok_a: Any, ids: list[int], ctx: int, top_n: int, cancelled: Callable[[], bool],
    take_turns: bool = True,
) -> tuple[list[PositionDiff], tuple[int, int]]:
    targets = np.asarray(ids, dtype=np.int64)
    turn: Any = threading.Lock() if take_turns else contextlib.nullcontext()  # held while a model runs a forward
    handoff: queue.Queue = queue.Queue(maxsize=1)  # A is at most one chunk ahead of B
    stop = threading.Event()  # set by whichever side ends early (error, cancel), so the other stops waiting

    def side_a(backend: Backend) -> int:
        try:
            runner, blocks = _scoring_blocks(backend, ids, ctx, "comparing two models")
        except BaseException:
            stop.set()  # B would wait for A's first chunk forever
            raise
        at = ctx
        try:
            for block in _in_turn(blocks, turn):
                if cancelled() or stop.is_set():
                    break
                n = block.shape[0]
                _put(handoff, own_stats(block, targets[at : at + n], top_n), stop)
                at += n
            _put(handoff, _END, stop)
        except _Stop:
            pass
        except BaseException:
            stop.set()
            raise
        finally:
            blocks.close()
            _close_runner(runner)
        return int(runner.forward_calls)

    def side_b(backend: Backend) -> tuple[list[PositionDiff], int]:
        names_a, names_b = TokenNames(tok_a), TokenNames(backend.tokenizer)
        runner, blocks = _scoring_blocks(backend, ids, ctx, "comparing two models")
        out: list[PositionDiff] = []
        pending: list[OwnStats] = []  # A's chunks not yet matched (the two runners may chunk differently)
        a_done = False
        try:
            for block in _in_turn(blocks, turn):
                if cancelled():
                    break
                at = ctx + len(out)
                n = block.shape[0]
                sb = own_stats(block, targets[at : at + n], top_n)
                while sum(s.token_logprob.shape[0] for s in pending) < n and not a_done:
                    item = _get(handoff, stop)
                    if item is _END:
                        a_done = True
                    else:
                        pending.append(item)
                sa, pending = _take(pending, n)
                if sa is None:  # A stopped early (cancelled)
                    break
                out.extend(_positions(at, ids, sa, sb, cross_stats(sa, sb), names_a, names_b,
                                      tok_a, backend.tokenizer))
        except _Stop:
            pass
        finally:
            stop.set()  # A stops waiting for a slot B will no longer free
            blocks.close()
            _close_runner(runner)
        return out, int(runner.forward_calls)

    fa = ta.call(side_a)
    fb = tb.call(side_b)
    try:
        positions, calls_b = fb.result()
    finally:
        stop.set()
    calls_a = fa.result()  # A's error, if it had one, is raised here
    return positions, (calls_a, calls_b)


def _in_turn(blocks: Iterator[np.ndarray], turn: Any) -> Iterator[np.ndarray]:
    """`blocks`, each one's forward run while holding `turn`, so the two models' forwards never overlap."""
    while True:
        with turn:
            block = next(blocks, None)
        if block is None:
            return
        yield block


def _take(pending: list[OwnStats], n: int) -> tuple[OwnStats | None, list[OwnStats]]:
    """The first `n` positions of A's queued chunks as one OwnStats, and what is left."""
    have = sum(s.token_logprob.shape[0] for s in pending)
    if have < n:
        return None, pending
    if pending[0].token_logprob.shape[0] == n:
        return pending[0], pending[1:]
    fields = ("logprobs", "probs", "token_logprob", "rank", "entropy", "best", "top_ids", "top_logprobs")
    joined = OwnStats(*(np.concatenate([getattr(s, f) for s in pending]) for f in fields))
    first = OwnStats(*(getattr(joined, f)[:n] for f in fields))
    rest = OwnStats(*(getattr(joined, f)[n:] for f in fields))
    return first, ([rest] if rest.token_logprob.shape[0] else [])


def _scored(pos: int, token_id: int, text: str, s: OwnStats, j: int, names: TokenNames) -> ScoredToken:
    top = names(tuple((int(t), float(v)) for t, v in zip(s.top_ids[j], s.top_logprobs[j])))
    return ScoredToken(pos, token_id, text, float(s.token_logprob[j]), int(s.rank[j]), float(s.entropy[j]), top)


def _positions(at: int, ids: list[int], sa: OwnStats, sb: OwnStats, cross: Any, names_a: TokenNames,
               names_b: TokenNames, tok_a: Any, tok_b: Any) -> list[PositionDiff]:
    out = []
    for j in range(sa.token_logprob.shape[0]):
        pos = at + j
        token = ids[pos]
        out.append(PositionDiff(
            pos,
            _scored(pos, token, tok_a.token_text(token), sa, j, names_a),
            _scored(pos, token, tok_b.token_text(token), sb, j, names_b),
            float(cross.kl_ab[j]), float(cross.kl_ba[j]),
            int(cross.a_top_rank_in_b[j]), int(cross.b_top_rank_in_a[j]),
        ))
    return out


# --- different tokenizers: byte-aligned spans --------------------------------------------------


def _span_diffs(text: str, spans_a: Sequence[tuple[int, int]], spans_b: Sequence[tuple[int, int]],
                ra: ScoreResult, rb: ScoreResult, tok_a: Any, tok_b: Any) -> list[SpanDiff]:
    data = text.encode("utf-8")
    lp_a = {t.index: t.logprob for t in ra.tokens}  # context tokens (and any after a cancel) are missing
    lp_b = {t.index: t.logprob for t in rb.tokens}
    out = []
    for span in aligned_spans(spans_a, spans_b, len(data)):
        def total(idx: tuple[int, ...], lps: dict[int, float]) -> float | None:
            if not idx or any(i not in lps for i in idx):
                return None
            return float(sum(lps[i] for i in idx))

        out.append(SpanDiff(
            span.start, span.end, data[span.start : span.end].decode("utf-8", errors="replace"),
            tuple(tok_a.token_text(ra.token_ids[i]) for i in span.a),
            tuple(tok_b.token_text(rb.token_ids[i]) for i in span.b),
            total(span.a, lp_a), total(span.b, lp_b),
        ))
    return out
