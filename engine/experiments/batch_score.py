"""Many texts (or context/continuation pairs) scored on one runner: one model context for the whole batch.

`Engine.score` builds a scoring context per call (a llama.cpp context of the
text's length and room for 256 rows of logits: 30-140 ms before the first
token is computed) and tears it down again. Here one runner with every
position's logits (`position_logits`: the research API's batch runner, or one
`PositionRunners` runner sized for the longest text) scores every item in turn,
so that cost is paid once per batch. Each item is its own sequence on the
runner (its cache cleared before it), so no item sees another's tokens, and
the per-position numbers come from the same `_Scorer` as `score_ids`: the
results equal `Engine.score`'s within float32 rounding (a context of another
size may round differently; tests/engine/test_batch_score.py bounds it). On llama.cpp, when its
threads leave a CPU free, the next item's forward runs on a helper thread while this item's
per-position report is made (`_one_ahead`): the same forwards and numbers, in less time.

Why not several texts in one forward: on the CPU it buys nothing. Measured in CPU time
(the default model, one thread, 100 sentences of ~10 tokens, a shared 2-core machine):
a text costs 107 ms of llama_decode and logits whether it runs alone or packed with
15-23 others as sequences of one `llama_decode` (96-100 ms both ways in another run),
against 10-13 ms for building and freeing a scoring context and 7-9 ms for the
per-position report; so `Engine.score`'s ~125 ms is at most ~1.2x this path's, and
packing cannot change that. (Packed sequences are bit-identical to each alone on a
context with `kv_unified = False`; the research runner's unified cache is the one
that mixes them wrongly, engine/backends/llamacpp/runner.py.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.backends.chunks import positions_per_chunk
from engine.capabilities import PositionRunners, ScoresAhead
from engine.experiments.score import (
    ScoredToken,
    ScoreResult,
    _checked_ids,
    _Scorer,
    score_step_by_step,
    text_ids,
)
from engine.tokenizer import TokenizerLike

log = logging.getLogger(__name__)

MAX_SCORE_FILE_BYTES = 256 << 20  # a JSONL of texts to score; beyond this it is likely the wrong file


@dataclass(frozen=True)
class ScoreItem:
    """One thing to score: a whole text, or a continuation after a context (only its tokens are scored).

    `id` is whatever the caller names the item by (a JSONL line's "id"); it travels to the output.
    """

    text: str | None = None
    context: str | None = None
    continuation: str | None = None
    id: Any = None

    def __post_init__(self) -> None:
        if self.text is not None:
            if self.context is not None or self.continuation is not None:
                raise ValueError("give either a text or a context and a continuation, not both")
            if not isinstance(self.text, str) or not self.text:
                raise ValueError("the text to score is empty" if self.text == "" else "the text must be a string")
        else:
            if not isinstance(self.continuation, str) or not self.continuation:
                raise ValueError("a continuation (non-empty text) is needed when no text is given")
            if self.context is not None and not isinstance(self.context, str):
                raise ValueError("the context must be a string")


def pair_ids(tokenizer: TokenizerLike, context: str, continuation: str) -> tuple[list[int], int]:
    """Token ids of `context` + `continuation` and how many lead ids are context (not scored).

    Each part is tokenized on its own (lm-eval-harness's way), so the continuation's tokens are the ones
    a model would be asked to produce after the context, never merged across the boundary. An empty
    context scores the continuation as `text_ids` scores a whole text.
    """
    if not context:
        return text_ids(tokenizer, continuation)
    ctx, n_ctx = text_ids(tokenizer, context)
    cont = tokenizer.encode(continuation, add_special_tokens=False)
    if not cont:
        raise ValueError(f"the continuation {continuation[:40]!r} has no tokens")
    return ctx + list(cont), len(ctx)


def item_ids(tokenizer: TokenizerLike, item: ScoreItem) -> tuple[list[int], int]:
    if item.text is not None:
        return text_ids(tokenizer, item.text)
    return pair_ids(tokenizer, item.context or "", item.continuation or "")


def checked_items(backend: Backend, items: Sequence[tuple[Sequence[int], int]]) -> list[tuple[list[int], int]]:
    """Every (token_ids, context) checked as `Engine.score` checks one text (`_checked_ids`: two tokens or more,
    within the model's context), before any scoring context is made; ValueError / ContextLengthError naming
    the item (0-based, as the output numbers them)."""
    checked = []
    for i, (ids, context) in enumerate(items):
        try:
            checked.append((_checked_ids(backend, ids, context), context))
        except ValueError as e:  # ContextLengthError is one
            raise type(e)(f"item {i}: {e}" if len(items) > 1 else str(e)) from None
    return checked


_Block = tuple[int, np.ndarray | None, int]  # (item, logits block or None at its end, forwards so far)


def _item_blocks(backend: Backend, runner: Any, checked: Sequence[tuple[list[int], int]], with_next: bool
                 ) -> Generator[tuple[int, np.ndarray | None, int], None, None]:
    """(item, block, forwards) for every (n, V) logits block of every item in order, then (item, None, forwards)
    at each item's end; `forwards` counts the item's forwards so far. The runner clears its cache between items."""
    chunk = positions_per_chunk(backend.info.vocab_size)
    for k, (ids, context) in enumerate(checked):
        before = runner.forward_calls
        # Without the next token's row the last token predicts nothing, so it is not run.
        blocks = runner.position_logits(ids if with_next else ids[:-1], first=context - 1, chunk=chunk)
        try:
            for block in blocks:  # one forward each
                yield k, block, runner.forward_calls - before
        finally:
            blocks.close()
        yield k, None, runner.forward_calls - before


def _one_ahead(stream: Generator[_Block, None, None]) -> Generator[_Block, None, None]:
    """`stream`, its next element computed on a helper thread while the caller handles the current one.

    For a runner whose forward releases the GIL (llama.cpp's `llama_decode`) and leaves a CPU free: the per-position report of one
    text (`_Scorer`, ~1.3 ms a token in Python and numpy) then runs while the next text's forward computes,
    instead of after it. The stream is only ever advanced by one thread at a time, so the runner's context is
    never used by two at once; the numbers are the same, only the order of the work changes."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-ahead") as ex:
        pending = ex.submit(next, stream, None)
        try:
            while (x := pending.result()) is not None:
                pending = ex.submit(next, stream, None)
                yield x
        finally:
            wait([pending])  # the forward in flight ends before the stream is closed (its cache cleared)
            stream.close()


def _each_on_runner(backend: Backend, runner: Any, checked: Sequence[tuple[list[int], int]], top_n: int,
                    cancelled: Callable[[], bool], with_next: bool = False
                    ) -> Iterator[tuple[ScoreResult, np.ndarray | None]]:
    """Each item's result, and with `with_next` the logits after its last token (the next token's row, one more
    position in the last forward), else None."""
    stream = _item_blocks(backend, runner, checked, with_next)
    if isinstance(runner, ScoresAhead) and runner.leaves_a_core_free():  # llama.cpp's runner
        stream = _one_ahead(stream)
    scorer: _Scorer | None = None
    scored: list[ScoredToken] = []
    after: np.ndarray | None = None
    try:
        for k, block, forwards in stream:
            ids, context = checked[k]
            if scorer is None:  # the item's first block
                if cancelled():
                    return
                scorer, scored, after = _Scorer(backend.tokenizer, ids, top_n), [], None
            if block is None:  # the item's end
                yield ScoreResult(tuple(ids), context, tuple(scored), 0, forwards), after
                scorer = None
                continue
            for row in block:
                if context + len(scored) < len(ids):
                    scored.append(scorer(context + len(scored), row))
                else:
                    after = row
            if cancelled():  # the item in progress, with the positions it reached
                yield ScoreResult(tuple(ids), context, tuple(scored), 0, forwards), after
                return
    finally:
        stream.close()  # the runner clears its cache for the next call


def score_on_runner(
    backend: Backend,
    runner: Any,
    items: Sequence[tuple[Sequence[int], int]],
    *,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> list[ScoreResult]:
    """Score each (token_ids, context) in turn on `runner` (it has `position_logits`); one result per item.

    A cancelled run returns the items scored so far (the one in progress with the positions it reached).
    Raises ValueError / ContextLengthError for a bad item before any is run, naming it.
    """
    return [r for r, _ in _each_on_runner(backend, runner, checked_items(backend, items), top_n, cancelled)]


def each_score(
    backend: Backend,
    items: Sequence[ScoreItem | str],
    *,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[ScoreResult]:
    """Each item's result as soon as it is scored, in order, on one scoring context of `backend`; iterate it on
    the backend's worker thread (the CLI writes every result as it comes, so 100,000 items stream).

    Every item is tokenized and checked first (`checked_items`): a text longer than the model's context is
    refused in words before a scoring context is sized for it. A backend with a position runner gets one runner
    sized for the longest item, used for all of them; others (a server, the mock) go step by step.
    """
    ids = [item_ids(backend.tokenizer, ScoreItem(text=it) if isinstance(it, str) else it) for it in items]
    yield from each_score_ids(backend, ids, top_n=top_n, cancelled=cancelled)


def each_score_ids(
    backend: Backend,
    items: Sequence[tuple[Sequence[int], int]],
    *,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[ScoreResult]:
    """`each_score` of items already tokenized: (token_ids, context) each (the server's echo: the prompt's ids as
    the model continues them, `context` 1)."""
    checked = checked_items(backend, items)
    if not checked:
        return
    if not isinstance(backend, PositionRunners):
        for i, c in checked:
            if cancelled():
                return
            yield score_step_by_step(backend, i, context=c, top_n=top_n, cancelled=cancelled)
        return
    runner = backend.position_runner(max(len(i) for i, _ in checked))
    try:
        for result, _ in _each_on_runner(backend, runner, checked, top_n, cancelled):
            yield result
    finally:
        runner.close()  # llama.cpp: its scoring context


def each_score_and_next(
    backend: Backend,
    items: Sequence[tuple[Sequence[int], int]],
    *,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[tuple[ScoreResult, np.ndarray]]:
    """`each_score_ids` with each item's logits after its last token (the distribution of the token that would
    follow: the server's one-token answers after an echo, engine/serve/next_token.py), computed in the same
    forward as the item's last scored positions. Needs a position runner (`PositionRunners`); call it on the
    backend's worker thread. A cancelled run stops before the next item (the one in progress is not yielded)."""
    if not isinstance(backend, PositionRunners):
        raise TypeError(f"{backend.info.name} has no position runner: its next-token logits come from decoding")
    checked = checked_items(backend, items)
    if not checked:
        return
    runner = backend.position_runner(max(len(i) for i, _ in checked) + 1)
    try:
        for result, after in _each_on_runner(backend, runner, checked, top_n, cancelled, with_next=True):
            if after is None:  # cancelled in its middle
                return
            yield result, after
    finally:
        runner.close()


def score_items(
    backend: Backend,
    items: Sequence[ScoreItem | str],
    *,
    top_n: int = 10,
    cancelled: Callable[[], bool] = lambda: False,
) -> list[ScoreResult]:
    """Score every item on one scoring context of `backend` (`each_score`, gathered); call it on the backend's
    worker thread."""
    return list(each_score(backend, items, top_n=top_n, cancelled=cancelled))


# --- the CLI's batch file: one JSON item per line ------------------------------------------------


def is_batch_file(path: str | None) -> bool:
    """`score --file X.jsonl` reads one item per line (anything else is one text)."""
    return path is not None and path != "-" and Path(path).suffix.lower() == ".jsonl"


def parse_item(line: str, where: str) -> ScoreItem:
    """One JSONL line: a JSON string (a text), or {"text": ...} or {"context": ..., "continuation": ...},
    with an optional "id"; ValueError naming `where` otherwise."""
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to read") from None
    if isinstance(d, str):
        d = {"text": d}
    if not isinstance(d, dict):
        raise ValueError(f'{where} must be a JSON string or an object with "text" or "context"/"continuation"')
    unknown = sorted(set(d) - {"text", "context", "continuation", "id"})
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
                         'expected "text", or "context" and "continuation", and optionally "id"')
    if "text" not in d and "continuation" not in d:
        raise ValueError(f'{where} has neither "text" nor "continuation"')
    try:
        return ScoreItem(text=d.get("text"), context=d.get("context"), continuation=d.get("continuation"),
                         id=d.get("id"))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def read_items(path: str | Path) -> list[ScoreItem]:
    """Every item of a JSONL batch file (blank lines skipped); ValueError naming the file and line."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"{path} is a folder, not a JSONL file of texts")
    try:
        size = p.stat().st_size
        if size > MAX_SCORE_FILE_BYTES:
            raise ValueError(f"{path} is {size >> 20} MiB; a batch to score is at most "
                             f"{MAX_SCORE_FILE_BYTES >> 20} MiB (split it)")
        data = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start} cannot be read)") from None
    items = [parse_item(line, f"{path} line {n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not items:
        raise ValueError(f"{path} holds no texts to score (one JSON item per line)")
    return items


def item_fields(item: ScoreItem, index: int) -> dict[str, Any]:
    """What an item's trace header carries so a reader can match it to its input line."""
    d: dict[str, Any] = {"item": index}
    if item.id is not None:
        d["id"] = item.id
    if item.text is not None:
        d["text"] = item.text
    else:
        d["context_text"] = item.context or ""
        d["continuation"] = item.continuation
    return d
