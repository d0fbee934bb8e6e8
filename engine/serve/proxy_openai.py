"""Proxy mode's reading of OpenAI's chat and text completions (engine.serve.proxy): what to ask, what to record,
what to take out again.

The upstream is asked for log-probs (the chosen token's and `top` alternatives) where the proxy is set to ask more
than the client did (`ServeOptions.upstream_top_n`; `top_logprobs` is then always said, as llama.cpp's server takes
20 when it is left out); each choice is recorded as it comes (engine.serve.proxy_events), and what the client did
not ask for (log-probs, alternatives past its number) is taken out before it is passed on. Completions take a list
of prompts: the answer has `n` choices per prompt (prompt p's j-th is choice p * n + j); with `echo` the prompt's
echoed part is cut off the record (engine.serve.proxy_echo). A stream is data-only lines ended by `[DONE]`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine.backends.remote.errors import ServerError
from engine.events import TokenEvent
from engine.request import Message
from engine.serve import fields as f
from engine.serve.errors import ApiError
from engine.serve.exchange import ServedExchange
from engine.serve.limits import MAX_N
from engine.serve.proxy_echo import echo_cuts, prompt_list
from engine.serve.proxy_events import UpstreamChoice
from engine.serve.proxy_limits import PROXY_MAX_CHOICES
from engine.serve.proxy_read import upstream_choices
from engine.serve.service import dumps

log = logging.getLogger(__name__)

StreamItem = Any  # what the event stream sends: a `data:` string, or {"event": name, "data": json}


class OpenAiShape:
    """One chat or text completions request through the proxy."""

    done: tuple[StreamItem, ...] = ("[DONE]",)

    def __init__(self, endpoint: str, body: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.body = body
        self.chat = endpoint == "chat.completions"
        self.path = "/chat/completions" if self.chat else "/completions"
        self.id_prefix = "chatcmpl-" if self.chat else "cmpl-"
        self.n = f.whole(body, "n", 1, MAX_N, 1) or 1
        self.cuts = [None] * self.n if self.chat else echo_cuts(body, self.n)
        if len(self.cuts) > PROXY_MAX_CHOICES:
            raise ApiError(400, f"the request asks for {len(self.cuts):,} answers ({self.n} per prompt); this proxy "
                                f"records at most {PROXY_MAX_CHOICES:,} of one request: send fewer prompts at once",
                           param="prompt", code="invalid_value")
        self.asked_top = _asked_top(body, self.chat)
        self.prompt_tokens = 0
        self.error: str | None = None  # the upstream's own failure, said in its stream (none in this API)

    def new_choices(self) -> list[UpstreamChoice]:
        return [UpstreamChoice(echo=cut) for cut in self.cuts]

    def exchange_fields(self) -> tuple[tuple[Message, ...] | None, str | None]:
        """(messages, prompt) as the record keeps them."""
        body = self.body
        messages = tuple(body["messages"]) if self.chat and isinstance(body.get("messages"), list) else None
        return messages, body.get("prompt") if isinstance(body.get("prompt"), str) else None

    def records(self, exchange: ServedExchange) -> list[ServedExchange]:
        """The request's records: one, or one per prompt of a list (`<id>-<p>`, each with its own prompt)."""
        prompts = prompt_list(self.body) if not self.chat else [None]
        if len(prompts) == 1:
            return [exchange]
        return [dataclasses.replace(exchange, id=f"{exchange.id}-{p}", prompt=text if isinstance(text, str) else None)
                for p, text in enumerate(prompts)]

    def forwarded(self, top: int) -> dict[str, Any]:
        asked = self.asked_top
        if asked is not None and asked >= top:
            return self.body
        if self.chat:
            return {**self.body, "logprobs": True, "top_logprobs": max(top, asked or 0)}
        return {**self.body, "logprobs": max(top, asked or 0)}

    def whole(self, doc: Any, choices: list[UpstreamChoice]) -> None:
        """Record a whole answer's choices and trim `doc` (in place) to what the client asked."""
        pairs = upstream_choices(doc, len(choices), stream=False)
        self.prompt_tokens = _prompt_tokens(doc)
        for i, choice in pairs:
            try:
                choices[i].feed(choice, whole=True)
            except ServerError as e:
                log.warning("the upstream's log-probs could not be read: %s", e)
            _trim_logprobs(choice, self.asked_top)

    def event(self, name: str | None, doc: Any,
              choices: list[UpstreamChoice]) -> list[tuple[int, list[TokenEvent]]]:
        """Record one streamed chunk (trimmed in place); the new tokens per choice."""
        pairs = upstream_choices(doc, len(choices), stream=True)
        self.prompt_tokens = _prompt_tokens(doc) or self.prompt_tokens
        out = []
        for i, choice in pairs:
            out.append((i, choices[i].feed(choice)))
            _trim_logprobs(choice, self.asked_top)
        return out

    def passed(self, name: str | None, data: str) -> StreamItem:
        return data

    def stopped(self, exchange: ServedExchange, choices: list[UpstreamChoice]) -> list[StreamItem]:
        """The last chunks after the window's Stop: each unfinished choice ends with finish_reason "stop"."""
        return [dumps(_stop_chunk(exchange, i, self.chat)) for i, c in enumerate(choices) if c.finish is None]

    def failed(self, error: ApiError) -> list[StreamItem]:
        return [dumps(error.body())]


def _asked_top(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives the client asked for (None: no log-probs at all)."""
    if chat:
        if body.get("logprobs") is not True:
            return None
        top = body.get("top_logprobs")
        return top if isinstance(top, int) and not isinstance(top, bool) else 0
    top = body.get("logprobs")
    return top if isinstance(top, int) and not isinstance(top, bool) else None


def _trim_logprobs(choice: dict[str, Any], asked_top: int | None) -> None:
    """Take out of a choice the log-probs the client did not ask for (in place)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return
    if asked_top is None:
        choice["logprobs"] = None
        return
    content = lp.get("content")
    for entry in content if isinstance(content, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("top_logprobs"), list):
            entry["top_logprobs"] = entry["top_logprobs"][:asked_top]
    if isinstance(lp.get("top_logprobs"), list):
        lp["top_logprobs"] = [dict(list(t.items())[:asked_top]) if isinstance(t, dict) else t
                              for t in lp["top_logprobs"]]


def _stop_chunk(exchange: ServedExchange, index: int, chat: bool) -> dict[str, Any]:
    if chat:
        choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    else:
        choice = {"index": index, "text": "", "logprobs": None, "finish_reason": "stop"}
    return {"id": exchange.id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(exchange.started_at), "model": exchange.model, "choices": [choice]}


def _prompt_tokens(doc: Any) -> int:
    usage = doc.get("usage") if isinstance(doc, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
