"""Completions that say the prompt's own log-probs (`echo` with `logprobs`, vLLM's `prompt_logprobs`), that only
score (`max_tokens: 0`), or that bring several prompts: the evaluators' door (lm-eval's `local-completions`
sends `echo: true, logprobs: 1, max_tokens: 1` with a batch of prompts, and reads the prompt's part).

The prompts are scored by the project's one scorer (`engine.experiments.batch_score.each_score_ids`: every
prompt of the request on one scoring context, each its own sequence, the per-position numbers of
`Engine.score`), in one turn at the model; then, when tokens are asked for, each prompt's answer runs as a
request of its own (`EngineService.collect`: told to the sinks and recorded like any answer), all of them
waiting together so they share a batch where the model has batch runners. Nothing here generates or scores a
token itself. A score-only request (`max_tokens: 0`) is not recorded: it has no answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.backend import Backend
from engine.errors import EngineError
from engine.events import GenerationStats, TokenEvent
from engine.experiments.score import ScoreResult
from engine.serve.body import client_address
from engine.serve.errors import engine_error
from engine.serve.exchange import ServedExchange
from engine.serve.fair_queue import TurnAbandoned
from engine.serve.limits import DISCONNECT_POLL_S
from engine.serve.next_token import answer_token, answers_from_scores, now
from engine.serve.parse import ServedRequest
from engine.serve.responses import completion_answer, usage

if TYPE_CHECKING:
    from engine.serve.service import ActiveAnswer, EngineService

T = TypeVar("T")


async def answer_prompts(service: EngineService, read: list[ServedRequest], body: dict[str, Any], request: Request,
                         answer_id: str) -> Response:
    """The whole answer to a completions request of `read` (one per prompt): prompt log-probs, answers, or both."""
    first = read[0]
    top = max(first.top_logprobs or 0 if first.echo else 0, first.prompt_logprobs or 0)
    wants_scores = (first.echo and first.top_logprobs is not None) or first.prompt_logprobs is not None
    cancel = threading.Event()
    scored: list[ScoreResult | None] = [None] * len(read)
    client = client_address(request).rsplit(":", 1)[0]
    ids = [answer_id if len(read) == 1 else f"{answer_id}-{r.prompt_index}" for r in read]
    exchanges: list[ServedExchange | None] = []
    try:
        if wants_scores and first.max_tokens > 0 and answers_from_scores(service.backend, read):
            # lm-eval's requests: each one-token answer from its scoring pass's last position (next_token.py)
            both = await _unless_gone(_score_and_answer(service, read, top, cancel, client), request, cancel,
                                      DISCONNECT_POLL_S)
            if both is None:
                return Response(status_code=499)
            scored = [s for s, _, _ in both]
            exchanges = [_recorded(service, service.active_answer(r, body, request, i), events, stats)
                         for r, i, (_, events, stats) in zip(read, ids, both)]
        elif wants_scores:
            got = await _unless_gone(_score(service, read, top, cancel, client), request, cancel, DISCONNECT_POLL_S)
            if got is None:
                return Response(status_code=499)
            scored = got
        if first.max_tokens > 0 and not exchanges:
            exchanges = list(await asyncio.gather(*(
                service.collect(service.active_answer(r, body, request, i), r, request) for r, i in zip(read, ids))))
            if any(e is None for e in exchanges):
                return Response(status_code=499)  # the client went away: every answer was cancelled
    except (EngineError, ValueError) as e:
        raise engine_error(e) from None
    choices: list[dict[str, Any]] = []
    completion_tokens = cached = 0
    for p, (r, result) in enumerate(zip(read, scored)):
        exchange = exchanges[p] if exchanges else None
        per_choice = [(list(c.events), c.text, c.finish_reason) for c in exchange.choices] if exchange else \
            [([], "", "length")] * r.n
        for j, (events, text, reason) in enumerate(per_choice):
            completion_tokens += len(events)
            choices.append(completion_answer(r, service.engine.tokenizer, result, events, text, reason,
                                             index=p * r.n + j))
        if exchange is not None and exchange.choices and exchange.choices[0].stats is not None:
            cached += exchange.choices[0].stats.reused_tokens
    doc = {"id": answer_id, "object": "text_completion", "created": _now(), "model": first.model,
           "choices": choices, "system_fingerprint": None,
           "usage": usage(sum(len(r.prompt_ids) for r in read), completion_tokens, cached)}
    return JSONResponse(doc)


async def _score(service: EngineService, read: Sequence[ServedRequest], top: int, cancel: threading.Event,
                 client: str) -> list[ScoreResult | None]:
    """Each prompt's teacher-forced scores, all in one turn at the model (a prompt of one token has none: nothing
    predicts its only token)."""
    from engine.experiments.batch_score import each_score_ids

    items = [(r.prompt_ids, 1) for r in read if len(r.prompt_ids) >= 2]
    try:
        async with service.queue.turn(client, cancel=cancel):
            if cancel.is_set():
                return [None] * len(read)
            future = service.engine.call(
                lambda backend: list(each_score_ids(backend, items, top_n=top, cancelled=cancel.is_set)))
            got: list[ScoreResult] = await asyncio.wrap_future(future)
            results = iter(got)
    except TurnAbandoned:
        return [None] * len(read)
    except RuntimeError as e:  # the model closed while this request waited its turn
        raise EngineError(f"the model was closed before this request's turn ({e})") from None
    return [next(results) if len(r.prompt_ids) >= 2 else None for r in read]


async def _score_and_answer(service: EngineService, read: Sequence[ServedRequest], top: int,
                            cancel: threading.Event, client: str
                            ) -> list[tuple[ScoreResult, list[TokenEvent], GenerationStats]] | None:
    """Each prompt's scores and its one-token answer (`next_token.answer_token`), all in one turn at the model;
    None when cancelled before the last prompt was done."""
    from engine.experiments.batch_score import each_score_and_next

    t0 = now()

    def job(backend: Backend) -> list[tuple[ScoreResult, list[TokenEvent], GenerationStats]]:
        out = []
        items = [(r.prompt_ids, 1) for r in read]
        for r, (result, logits) in zip(read, each_score_and_next(backend, items, top_n=top, cancelled=cancel.is_set)):
            out.append((result, *answer_token(backend, r.generation, r.prompt_ids, logits, t0)))
        return out

    try:
        async with service.queue.turn(client, cancel=cancel):
            if cancel.is_set():
                return None
            got = await asyncio.wrap_future(service.engine.call(job))
    except TurnAbandoned:
        return None
    except RuntimeError as e:  # the model closed while this request waited its turn
        raise EngineError(f"the model was closed before this request's turn ({e})") from None
    return got if len(got) == len(read) else None


def _recorded(service: EngineService, active: ActiveAnswer, events: list[TokenEvent],
              stats: GenerationStats) -> ServedExchange:
    """An answer made in the scoring turn, told to the sinks and recorded as the decode loop's answers are."""
    exchange = active.exchange
    service.active[exchange.id] = active
    service.sinks.on_start(exchange)
    for event in events:
        active.events[0].append(event)
        service.sinks.on_token(exchange.id, 0, event)
    active.stats[0] = stats
    return service._end(active)


async def _unless_gone(work: Awaitable[T], request: Request, cancel: threading.Event, poll_s: float) -> T | None:
    """`work`'s result, or None when the client went away first (then `cancel` is set: the scorer stops before
    its next position)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                cancel.set()
                task.cancel()
                return None
    except BaseException:
        cancel.set()
        task.cancel()
        raise


def _now() -> int:
    return int(time.time())

