"""Another API's answer over the one `EngineService`: the same turn at the model, record and disconnect handling.

The Responses and Anthropic Messages adapters (engine.serve.responses_api, engine.serve.anthropic_api) read
their body into the service's `ServedRequest` (through engine.serve.parse) and write the answer in their own
shapes; everything between is the service's: its queue, `_run` (the turn at the model, batched or alone, each
token told to the sinks) and `_end` (the record's end, told once). Nothing here generates a token.

A stream is a list of server-sent events (`{"event": name, "data": json}`) per step, from an `AdaptedStream`;
a client that leaves mid-stream cancels its generation (the generator is closed) and the model is free for the
next one, as for chat.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.requests import Request

from engine.errors import EngineError
from engine.events import GenerationStats, TokenEvent
from engine.serve.body import client_address
from engine.serve.errors import ApiError, engine_error
from engine.serve.exchange import ExchangeEndpoint, ServedExchange
from engine.serve.parse import ServedRequest
from engine.serve.service import ActiveAnswer, EngineService, cached_tokens, dumps

Sse = dict[str, str]  # one server-sent event: {"event": its name, "data": its JSON}


def sse(name: str, doc: dict[str, Any]) -> Sse:
    return {"event": name, "data": dumps(doc)}


class AdaptedStream(Protocol):
    """One streamed answer's events in an API's shape."""

    def opening(self) -> list[Sse]: ...

    def token(self, event: TokenEvent) -> list[Sse]: ...

    def recorded(self, stats: GenerationStats) -> GenerationStats: ...

    def closing(self, exchange: ServedExchange, cached: int) -> list[Sse]: ...

    def failed(self, error: ApiError) -> list[Sse]: ...


class ClientLeft(Exception):
    """A whole (not streamed) answer's client went away; its generation was cancelled and recorded so."""


def begin(service: EngineService, endpoint: ExchangeEndpoint, served: ServedRequest, body: dict[str, Any],
          request: Request, id_prefix: str) -> ActiveAnswer:
    """The answer's record, before its turn (503 when too many wait), as `EngineService.answer` makes it."""
    if service.queue.waiting >= service.queue.max_waiting:
        raise ApiError(503, f"the model is busy: {service.queue.waiting} requests are waiting; try again shortly",
                       code="server_busy")
    exchange = ServedExchange(
        id=id_prefix + secrets.token_hex(12), endpoint=endpoint, model=served.model, client=client_address(request),
        proxied=False, upstream=None, messages=served.messages, prompt=served.prompt, prompt_ids=served.prompt_ids,
        sampler=served.sampler, request=served.generation, n=served.n, stream=served.stream, body=body,
    )
    return ActiveAnswer(exchange, events=[[] for _ in range(served.n)], stats=[None] * served.n)


async def stream(service: EngineService, active: ActiveAnswer, served: ServedRequest,
                 writer: AdaptedStream) -> AsyncIterator[Sse]:
    """The answer as `writer`'s events; an error after the first event goes as `writer.failed`'s events."""
    ended = False
    try:
        for doc in writer.opening():
            yield doc
        async for _, event in service._run(active, served):
            if isinstance(event, TokenEvent):
                for doc in writer.token(event):
                    yield doc
            elif event.stats.finish_reason == "error":
                raise EngineError(event.stats.error or "the model failed in the middle of the answer")
            else:
                active.stats[0] = writer.recorded(event.stats)  # a streamed call's id as the client got it
        ended = True
        exchange = service._end(active)
        for doc in writer.closing(exchange, cached_tokens(active.stats)):
            yield doc
    except (ApiError, EngineError, ValueError) as e:
        ended = True  # the stream has begun (status 200): the error goes as the API's error events
        service._end(active, error=str(e))
        for doc in writer.failed(e if isinstance(e, ApiError) else engine_error(e)):
            yield doc
    finally:
        if not ended:  # the client went away (the generator was closed) or the server is stopping
            active.cancel.set()
            service._end(active, disconnected=True)


async def whole(service: EngineService, active: ActiveAnswer, served: ServedRequest,
                request: Request) -> ServedExchange:
    """The whole answer's record (the service's own `collect`); raises ApiError when the model failed,
    ClientLeft when the client went away."""
    exchange = await service.collect(active, served, request)
    if exchange is None:
        raise ClientLeft()
    return exchange


def stop_string(exchange: ServedExchange) -> str | None:
    """The stop string that ended the first answer (None: it ended otherwise). The matcher cuts the text where
    the first stop string begins, so the tokens' own text goes on with it there."""
    choice = exchange.choices[0] if exchange.choices else None
    stops = exchange.request.stop if exchange.request is not None else ()
    if choice is None or choice.stats is None or choice.stats.finish_reason != "stop" or not stops:
        return None
    raw = "".join(e.token_text for e in choice.events)
    cut = len(choice.stats.text)
    found = [s for s in stops if raw.startswith(s, cut)] or [s for s in stops if s in raw]
    return found[0] if found else None
