"""The record of one served request (`ServedExchange`) and the sink that receives them live (`ExchangeSink`).

This is the seam between the server and whatever shows or stores what it served (the window, the CLI's
trace files). A sink gets three calls per request, on the server's event loop thread:

- `on_start(exchange)`: the request was read; `exchange.choices` is empty;
- `on_token(exchange_id, choice, event)`: one more token of choice `choice` (0-based), a `TokenEvent`
  with its top-N (and stage records when the server records them);
- `on_end(exchange)`: the same exchange, whole: every choice's tokens, stats and finish reason, and how it
  ended (`error`, `stopped`, `disconnected`).

A request that is refused before it runs (a bad field) makes no exchange. Sink calls must return quickly
(they run between tokens of every client); an exception in a sink is logged and the answer goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from engine.events import GenerationStats, TokenEvent
from engine.request import GenerationRequest, Message
from engine.sampling.settings import SamplerSettings

log = logging.getLogger(__name__)

Endpoint = Literal["chat.completions", "completions"]
# What a record comes through: OpenAI's two, Responses and Anthropic Messages (engine.serve.adapted).
ExchangeEndpoint = Literal["chat.completions", "completions", "responses", "messages"]


@dataclass(frozen=True)
class ServedChoice:
    """One answer of a request (the API's `choices[index]`)."""

    index: int
    events: tuple[TokenEvent, ...]
    stats: GenerationStats | None  # None: it did not end (an error before its first token, or the client went away)
    finish_reason: str  # as the client was told: "stop", "length", "error"; "cancelled" when the client went away

    @property
    def text(self) -> str:
        return self.stats.text if self.stats is not None else "".join(e.text for e in self.events)


@dataclass(frozen=True)
class ServedExchange:
    """One request a client sent and what it was answered, token by token.

    Attributes:
        id: the answer's id as the client saw it ("chatcmpl-..." / "cmpl-..."); `RunningServer.stop_request` takes it.
        endpoint: "chat.completions", "completions", "responses" (/v1/responses) or "messages" (/v1/messages).
        model: the model name the answer reports.
        client: the client's address, "host:port" ("" when unknown).
        proxied: True when the answer came from the upstream server (proxy mode), not from the engine.
        upstream: the upstream's base URL in proxy mode, else None.
        messages: chat: the client's messages (text parts joined); else None.
        prompt: completions: the text prompt (None when the prompt was token ids, or a chat).
        prompt_ids: the tokens the model continued (engine mode; () in proxy mode, where the upstream tokenizes).
        sampler: the settings the answer was sampled with (proxy: as the client asked the upstream; None where
            they are not expressible as ours).
        request: what the engine ran (None in proxy mode).
        n: choices asked for.
        stream: whether the client asked for a stream.
        body: the client's JSON body as received.
        started_at, finished_at: wall-clock times (time.time()); finished_at None until the end.
        choices: per choice, its tokens and how it ended (empty in `on_start`).
        error: why the answer failed, in words (None when it did not).
        stopped: the server's stop API (the window's Stop) ended it.
        disconnected: the client went away before the end (its generation was cancelled).
    """

    id: str
    endpoint: ExchangeEndpoint
    model: str
    client: str
    proxied: bool
    upstream: str | None
    messages: tuple[Message, ...] | None
    prompt: str | None
    prompt_ids: tuple[int, ...]
    sampler: SamplerSettings | None
    request: GenerationRequest | None
    n: int
    stream: bool
    body: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    choices: tuple[ServedChoice, ...] = ()
    error: str | None = None
    stopped: bool = False
    disconnected: bool = False

    @property
    def seed(self) -> int | None:
        """The seed the first choice ran with (a fresh one when the client gave none), else the one asked for."""
        for c in self.choices:
            if c.stats is not None and c.stats.seed >= 0:
                return c.stats.seed
        return self.sampler.seed if self.sampler is not None else None


@runtime_checkable
class ExchangeSink(Protocol):
    """Receives served exchanges live. Called on the server's event-loop thread (not the caller's): a window
    moves each call to its own thread (e.g. with a queued signal or `loop.call_soon_threadsafe`)."""

    def on_start(self, exchange: ServedExchange) -> None: ...

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None: ...

    def on_end(self, exchange: ServedExchange) -> None: ...


class Sinks:
    """Several sinks as one; a sink that raises is logged and skipped, never the answer's end."""

    def __init__(self, sinks: Sequence[ExchangeSink] = ()) -> None:
        self.sinks = tuple(s for s in sinks if s is not None)

    def _each(self, what: str, *args: Any) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, what)(*args)
            except Exception:  # noqa: BLE001 - a broken viewer must not break a client's answer
                log.exception("served-exchange sink %r failed in %s", sink, what)

    def on_start(self, exchange: ServedExchange) -> None:
        self._each("on_start", exchange)

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        self._each("on_token", exchange_id, choice, event)

    def on_end(self, exchange: ServedExchange) -> None:
        self._each("on_end", exchange)
