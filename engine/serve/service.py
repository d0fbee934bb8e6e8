"""The server's work for the engine: read a request, wait for the model's turn, run it, answer, record it.

One `EngineService` per server, used on the server's event loop only. Every request that passes its checks
becomes a `ServedExchange` told to the sink as it goes (start, each token, end). `stop_request(id)` (the
window's Stop) cancels one answer: a stream then ends as if the model had stopped (finish_reason "stop",
then `[DONE]`), a whole answer returns the text so far with finish_reason "stop".
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.engine import Engine
from engine.errors import EngineError
from engine.events import Done, Event, GenerationStats, TokenEvent
from engine.capabilities import JoinableBatches
from engine.loom.continuations import runs_in_batch
from engine.decode.shared_batch import cells_needed
from engine.serve.engine_run import Rider, SharedBatch, engine_events, rider_events, shared_batch
from engine.serve.body import client_address
from engine.serve.errors import ApiError, engine_error
from engine.serve.exchange import Endpoint, ServedChoice, ServedExchange, Sinks
from engine.serve.fair_queue import FairQueue, TurnAbandoned
from engine.serve.limits import BODY_TIMEOUT_S, DISCONNECT_POLL_S, HEADER_TIMEOUT_S, MAX_BATCH_ROWS, MAX_CONNECTIONS
from engine.serve.model_routes import ModelRoutes
from engine.serve.parse import ParseContext, ServedRequest, parse_requests
from engine.serve.proxy_limits import ProxyLimits
from engine.serve.responses import AnswerWriter, finish_reason

log = logging.getLogger(__name__)



def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


@dataclass
class ActiveAnswer:
    """An answer under way (or waiting for its turn): what stopping it needs."""

    exchange: ServedExchange
    cancel: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False
    events: list[list[TokenEvent]] = field(default_factory=list)
    stats: list[GenerationStats | None] = field(default_factory=list)

    def stop(self) -> None:
        self.stopped = True
        self.cancel.set()


@dataclass(frozen=True)
class ServeOptions:
    """What the server records and how many requests it lets wait.

    Attributes:
        top_n: alternatives recorded per token (the window's inspector), whatever the client asked for.
        record_stages: record each sampler stage's distribution per token (the window's stage view).
        max_waiting: requests waiting for the model before the server answers 503.
        cont_batching: requests that come while a shared batch runs join it (where the model's batch runner
            admits rows: llama.cpp); off, they wait for the next turn (llama.cpp server's `--no-cont-batching`).
        proxy: proxy mode's caps on an upstream answer and its connections (engine.serve.proxy_limits).
        header_timeout_s: a connection's request line and headers must come within this, else 408 and closed
            (`--header-timeout`; None: no limit). engine.serve.limits has the defaults and why.
        body_timeout_s: a request's body must come within this of its headers, else 408 and closed (`--timeout`).
        max_connections: connections open at once; past it a new one gets a 503 and is closed
            (`--max-connections`); never more than the open-file limit leaves room for.
        aliases: other names the model answers to (`--alias`, llama.cpp server's `-a`): a request naming one is
            served (and answered under that name); any other name is a 404.
        upstream_top_n: proxy mode only (`--upstream-top-n`): the alternatives per token asked of the upstream,
            more than the client asked, for the record (0 to 20; 0: the chosen tokens' log-probs alone). None:
            the client's body goes as it is, as asking log-probs behind llama.cpp's server costs several times
            the plain answer's time and can change its greedy text; the record then has what the client asked.
    """

    top_n: int = 20
    record_stages: bool = True
    max_waiting: int = 64
    cont_batching: bool = True
    proxy: ProxyLimits = ProxyLimits()
    header_timeout_s: float | None = HEADER_TIMEOUT_S
    body_timeout_s: float | None = BODY_TIMEOUT_S
    max_connections: int | None = MAX_CONNECTIONS
    aliases: tuple[str, ...] = ()
    upstream_top_n: int | None = None


class EngineService(ModelRoutes):
    """Answers chat and completion requests from one `Engine` (and the model routes: `ModelRoutes`)."""

    def __init__(self, engine: Engine, sinks: Sinks, options: ServeOptions = ServeOptions()) -> None:
        super().__init__(engine, tuple(a for a in options.aliases if a != engine.info.name))
        self.sinks = sinks
        self.options = options
        info = engine.info
        self.model_name = info.name
        self.context = ParseContext(model=info.name, context_length=info.context_length, tokenizer=engine.tokenizer,
                                    runs_locally=info.runs_locally, top_n=options.top_n,
                                    record_stages=options.record_stages, aliases=self.aliases)
        self.backend = engine.wait_ready()  # only asked what it can do (its capabilities), never called here
        self.queue = FairQueue(max_waiting=options.max_waiting, joins=self._joins)
        # Requests join a batch under way where the model's batch runners admit rows (llama.cpp's).
        self.cont_batching = options.cont_batching and isinstance(self.backend, JoinableBatches) and \
            self.backend.batch_runners_admit_rows()
        self.active: dict[str, ActiveAnswer] = {}

    def stop_request(self, answer_id: str) -> bool:
        """End one answer as if the model had stopped; False when no such answer is under way."""
        answer = self.active.get(answer_id)
        if answer is None:
            return False
        answer.stop()
        return True

    async def answer(self, endpoint: Endpoint, body: dict[str, Any], request: Request) -> Response:
        read = await asyncio.to_thread(parse_requests, endpoint, body, self.context)
        if self.queue.waiting + len(read) > self.queue.max_waiting:
            raise ApiError(503, f"the model is busy: {self.queue.waiting} requests are waiting; try again shortly",
                           code="server_busy")
        served = read[0]
        answer_id = ("chatcmpl-" if endpoint == "chat.completions" else "cmpl-") + secrets.token_hex(12)
        if len(read) > 1 or served.echo or served.prompt_logprobs is not None or served.max_tokens == 0:
            from engine.serve.scoring import answer_prompts  # several prompts, or the prompt's own log-probs

            return await answer_prompts(self, read, body, request, answer_id)
        active = self.active_answer(served, body, request, answer_id)
        writer = AnswerWriter(answer_id, served)
        if served.stream:
            return EventSourceResponse(self._stream(active, served, writer), ping=15)
        return await self._whole(active, served, writer, request)

    def active_answer(self, served: ServedRequest, body: dict[str, Any], request: Request,
                      answer_id: str) -> ActiveAnswer:
        """The record of one answer about to wait for its turn (`collect` or a stream runs it)."""
        exchange = ServedExchange(
            id=answer_id, endpoint=served.endpoint, model=served.model, client=client_address(request),
            proxied=False, upstream=None, messages=served.messages, prompt=served.prompt,
            prompt_ids=served.prompt_ids, sampler=served.sampler, request=served.generation, n=served.n,
            stream=served.stream, body=body,
        )
        return ActiveAnswer(exchange, events=[[] for _ in range(served.n)], stats=[None] * served.n)

    # --- running --------------------------------------------------------------------------------------------

    def _rider(self, active: ActiveAnswer, served: ServedRequest) -> Rider | None:
        """The request as a possible row of a shared batch; None where it runs alone (`runs_in_batch`)."""
        request = served.generation
        # A request with tools runs in the decode loop: its grammar lives there (as a constraint's does).
        if not runs_in_batch(self.backend, request) or served.tools is not None and served.tools.choice.calls:
            return None
        return Rider(request, served.n, active.cancel,
                     cells=cells_needed(len(served.prompt_ids), served.n, request.max_new_tokens))

    def _joins(self, taken: Sequence[Rider], candidate: Rider) -> bool:
        """Whether a waiting request can share the batch of those `taken`: at most MAX_BATCH_ROWS answers, and
        room in the model's context for all their prompts and answers (the batch runner's KV cache is one
        context's size)."""
        room = self.context.context_length or 0
        return (sum(r.n for r in taken) + candidate.n <= MAX_BATCH_ROWS
                and sum(r.cells for r in taken) + candidate.cells <= room)

    def _run_batch(self, riders: list[Rider], release: Callable[[], None]) -> None:
        """Start a shared batch; while it runs, the fair queue offers it newcomers (`FairQueue.join_running`)."""
        batch: SharedBatch | None = None

        def over() -> None:
            if self.queue.join_running == join:
                self.queue.join_running = None
            release()

        def join(candidate: Rider) -> bool:
            assert batch is not None
            going_on = [r for r in batch.riders if not r.ended]
            room = self.context.context_length or 0
            # Rows: those still going; the KV cache: every rider's cells, as a row's stay taken after it ends.
            return (sum(r.n for r in going_on) + candidate.n <= MAX_BATCH_ROWS
                    and sum(r.cells for r in batch.riders) + candidate.cells <= room
                    and batch.join(candidate))

        if self.cont_batching:
            self.queue.join_running = join
        batch = shared_batch(self.engine, riders, over)

    async def _run(self, active: ActiveAnswer, served: ServedRequest) -> AsyncIterator[tuple[int, TokenEvent | Done]]:
        """The answer's events, after its turn at the model (alone, or in a batch with other requests that
        waited with it); records them and tells the sink."""
        exchange = active.exchange
        self.active[exchange.id] = active
        self.sinks.on_start(exchange)
        rider = self._rider(active, served)
        try:
            async with self.queue.turn(exchange.client.rsplit(":", 1)[0], cancel=active.cancel,
                                       rider=rider) as turn:
                if active.cancel.is_set() and not turn.joined and not turn.riders:
                    return  # stopped as its turn came (with riders it still starts their batch: its rows end at once)
                source: AsyncIterator[tuple[int, Event]]
                # A request that had to wait for the model runs as a batch, even alone, so that those that come
                # while it runs can join it; one that found the model free runs through the decode loop, whose
                # cache the client's next turn starts from.
                as_batch = bool(turn.riders) or (turn.waited and rider is not None and self.cont_batching)
                if turn.joined or as_batch:
                    assert rider is not None
                    if as_batch:  # this request's turn, shared: the model is free when the batch is done
                        self._run_batch([rider, *turn.riders], turn.hand_over())
                    source = rider_events(rider)
                else:
                    source = engine_events(self.engine, served.generation, served.n, active.cancel)
                async for index, event in source:
                    if isinstance(event, TokenEvent):
                        active.events[index].append(event)
                        self.sinks.on_token(exchange.id, index, event)
                    else:
                        active.stats[index] = event.stats
                    yield index, event
        except TurnAbandoned:
            return  # stopped while it waited: no tokens; the caller ends the answer as stopped

    def _end(self, active: ActiveAnswer, *, error: str | None = None, disconnected: bool = False) -> ServedExchange:
        """Record the end of the answer and tell the sink (once)."""
        if self.active.pop(active.exchange.id, None) is None:
            return active.exchange
        def reason(stats: GenerationStats | None) -> str:
            if stats is None and active.stopped and not error:
                return "stop"  # stopped before its turn: the client is told the answer stopped, empty
            if stats is None and disconnected:
                return "cancelled"  # the client went away: told nothing, its generation stopped before the next token
            return "error" if error and stats is None else finish_reason(stats)

        choices = tuple(ServedChoice(i, tuple(events), stats, reason(stats))
                        for i, (events, stats) in enumerate(zip(active.events, active.stats)))
        active.exchange = dataclasses.replace(active.exchange, finished_at=time.time(), choices=choices, error=error,
                                              stopped=active.stopped, disconnected=disconnected)
        self.sinks.on_end(active.exchange)
        return active.exchange

    async def _stream(self, active: ActiveAnswer, served: ServedRequest, writer: AnswerWriter) -> AsyncIterator[str]:
        ended = False
        try:
            for chunk in writer.first_chunks():
                yield dumps(chunk)
            async for index, event in self._run(active, served):
                if isinstance(event, TokenEvent):
                    doc = writer.token_chunk(index, event)
                    if doc is not None:
                        yield dumps(doc)
                elif event.stats.finish_reason == "error":
                    raise EngineError(event.stats.error or "the model failed in the middle of the answer")
                else:
                    active.stats[index] = writer.recorded_stats(index, event.stats)
                    for doc in writer.end_chunks(index, event.stats):
                        yield dumps(doc)
            for index, stats in enumerate(active.stats):
                if stats is None and active.stopped:  # stopped before its turn at the model: still a last chunk
                    yield dumps(writer.final_chunk(index, "stop"))
            if served.include_usage:
                yield dumps(writer.usage_chunk(sum(len(e) for e in active.events), cached_tokens(active.stats)))
            ended = True
            self._end(active)
            yield "[DONE]"
        except (ApiError, EngineError, ValueError) as e:
            # The stream has begun (status 200): the error goes as an event, the way OpenAI's servers send one.
            ended = True
            self._end(active, error=str(e))
            err = e if isinstance(e, ApiError) else engine_error(e)
            yield dumps(err.body())
            yield "[DONE]"
        finally:
            if not ended:  # the client went away (the task was cancelled) or the server is stopping
                active.cancel.set()
                self._end(active, disconnected=True)

    async def _whole(self, active: ActiveAnswer, served: ServedRequest, writer: AnswerWriter,
                     request: Request) -> Response:
        exchange = await self.collect(active, served, request)
        if exchange is None:
            return Response(status_code=499)
        per_choice = [(list(c.events), c.text, c.finish_reason) for c in exchange.choices]
        return JSONResponse(writer.whole(per_choice, cached_tokens(active.stats), [c.stats for c in exchange.choices]))

    async def collect(self, active: ActiveAnswer, served: ServedRequest, request: Request) -> ServedExchange | None:
        """Run one answer to its end (not streamed) and record it; None when the client went away first (its
        generation is cancelled); ApiError for a failed model."""
        async def collect() -> None:
            async for _ in self._run(active, served):
                pass

        task = asyncio.ensure_future(collect())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    break
                if await request.is_disconnected():
                    active.cancel.set()
                    task.cancel()
                    self._end(active, disconnected=True)
                    return None
            task.result()
        except (EngineError, ValueError) as e:
            self._end(active, error=str(e))
            raise engine_error(e) from None
        except BaseException:
            task.cancel()
            active.cancel.set()
            self._end(active, disconnected=True)
            raise
        failed = [s for s in active.stats if s is not None and s.finish_reason == "error"]
        if failed:
            self._end(active, error=failed[0].error)
            raise ApiError(500, f"the model failed in the middle of the answer: {failed[0].error}")
        return self._end(active)


def cached_tokens(stats: Sequence[GenerationStats | None]) -> int:
    """The prompt's tokens not computed for this request: what its first answer reused (from the model's cache,
    or a beginning computed once for a shared batch); its other answers copy that answer's prompt."""
    return stats[0].reused_tokens if stats and stats[0] is not None else 0
