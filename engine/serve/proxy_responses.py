"""Proxy mode's reading of OpenAI's Responses API (`/v1/responses`, engine.serve.proxy): what to ask, what to
record, what to take out again.

The upstream is asked for the output text's log-probs (`include: ["message.output_text.logprobs"]` and
`top_logprobs`) where the proxy is set to ask more than the client did (`ServeOptions.upstream_top_n`); the record
takes each `output_text` part's text and log-probs (a whole response's, or each `response.output_text.delta`
event's), its end from `response.completed` / `response.incomplete` (`max_output_tokens`: "length") and
`usage.input_tokens`; `response.failed` and `error` events are the record's error. What the client did not ask for
is taken out before it is passed on: the `logprobs` of each part and event (alternatives past its `top_logprobs`),
and the response's `top_logprobs` says the client's number again. The stream's events pass with their names; it has
no `[DONE]`.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from engine.backends.remote.errors import ServerError
from engine.events import TokenEvent
from engine.request import Message
from engine.serve.errors import ApiError
from engine.serve.exchange import ServedExchange
from engine.serve.proxy_events import UpstreamChoice
from engine.serve.proxy_messages_text import responses_messages
from engine.serve.proxy_read import BadUpstream
from engine.serve.responses_api import LOGPROBS_INCLUDE
from engine.serve.service import dumps

log = logging.getLogger(__name__)

StreamItem = Any


class ResponsesShape:
    """One Responses request through the proxy (one answer: the response's output text)."""

    endpoint = "responses"
    path = "/responses"
    id_prefix = "resp_"
    done: tuple[StreamItem, ...] = ()

    def __init__(self, endpoint: str, body: dict[str, Any]) -> None:
        self.body = body
        include = body.get("include")
        top = body.get("top_logprobs")
        self.top = top if isinstance(top, int) and not isinstance(top, bool) else None
        asked = (isinstance(include, list) and LOGPROBS_INCLUDE in include) or self.top is not None
        self.asked_top = (self.top or 0) if asked else None
        self.prompt_tokens = 0
        self.error: str | None = None
        self.sequence = -1  # the last event's sequence_number
        self.started: dict[str, Any] | None = None  # the response object the stream began with
        self.item_id: str | None = None

    def new_choices(self) -> list[UpstreamChoice]:
        return [UpstreamChoice()]

    def exchange_fields(self) -> tuple[tuple[Message, ...] | None, str | None]:
        return responses_messages(self.body), None

    def records(self, exchange: ServedExchange) -> list[ServedExchange]:
        return [exchange]

    def forwarded(self, top: int) -> dict[str, Any]:
        include = self.body.get("include", [])
        if not isinstance(include, list) or (self.asked_top is not None and self.asked_top >= top):
            return self.body  # a malformed include is the upstream's to refuse, in its words
        return {**self.body, "include": include if LOGPROBS_INCLUDE in include else [*include, LOGPROBS_INCLUDE],
                "top_logprobs": max(top, self.asked_top or 0)}

    def whole(self, doc: Any, choices: list[UpstreamChoice]) -> None:
        """Record a whole response's output text and trim `doc` (in place) to what the client asked."""
        if not isinstance(doc, dict):
            raise BadUpstream(f"answered with JSON that is not a response object: {repr(doc)[:60]}")
        for part in _text_parts(doc):
            _feed(choices[0], part.get("text"), part.get("logprobs"), whole=True)
        self._ended(doc, choices[0])
        self._trim(doc)

    def event(self, name: str | None, doc: Any,
              choices: list[UpstreamChoice]) -> list[tuple[int, list[TokenEvent]]]:
        if not isinstance(doc, dict):
            raise BadUpstream(f"streamed an event that is not a JSON object: {repr(doc)[:60]}")
        kind = doc.get("type") if isinstance(doc.get("type"), str) else name
        if isinstance(doc.get("sequence_number"), int):
            self.sequence = doc["sequence_number"]
        out = []
        if kind == "response.output_text.delta":
            self.item_id = doc.get("item_id") if isinstance(doc.get("item_id"), str) else self.item_id
            out.append((0, _feed(choices[0], doc.get("delta"), doc.get("logprobs"), whole=False)))
        elif kind in ("response.created", "response.in_progress") and isinstance(doc.get("response"), dict):
            self.started = doc["response"]
        elif kind in ("response.completed", "response.incomplete", "response.failed") \
                and isinstance(doc.get("response"), dict):
            self._ended(doc["response"], choices[0])
        elif kind == "error":
            self.error = f"the upstream's stream said: {_words(doc)}"
        self._trim(doc)
        return out

    def _ended(self, response: dict[str, Any], choice: UpstreamChoice) -> None:
        status = response.get("status")
        usage = response.get("usage")
        tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            self.prompt_tokens = tokens
        details = response.get("incomplete_details")
        if status == "incomplete":
            reason = details.get("reason") if isinstance(details, dict) else None
            choice.finish = "length" if reason == "max_output_tokens" else "stop"
        elif status == "completed":
            output = response.get("output")
            calls = isinstance(output, list) and any(isinstance(o, dict) and o.get("type") == "function_call"
                                                     for o in output)
            choice.finish = "tool_calls" if calls else "stop"
        elif status == "failed":
            self.error = f"the upstream's response failed: {_words(response)}"

    def _trim(self, doc: Any) -> None:
        """Take out of `doc` (in place, at any depth) the log-probs the client did not ask for."""
        if isinstance(doc, list):
            for v in doc:
                self._trim(v)
            return
        if not isinstance(doc, dict):
            return
        if doc.get("object") == "response" and "top_logprobs" in doc:
            doc["top_logprobs"] = self.top or 0
        lps = doc.get("logprobs")
        if isinstance(lps, list):
            if self.asked_top is None:
                if doc.get("type") == "output_text":
                    del doc["logprobs"]  # a part carries none when none was asked
                else:
                    doc["logprobs"] = []  # an event's field is an empty list then
            else:
                for entry in lps:
                    if isinstance(entry, dict) and isinstance(entry.get("top_logprobs"), list):
                        entry["top_logprobs"] = entry["top_logprobs"][:self.asked_top]
        for key, v in doc.items():
            if key != "logprobs" and isinstance(v, (dict, list)):
                self._trim(v)

    def passed(self, name: str | None, data: str) -> StreamItem:
        return {"event": name, "data": data} if name else {"data": data}

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence

    def stopped(self, exchange: ServedExchange, choices: list[UpstreamChoice]) -> list[StreamItem]:
        """After the window's Stop: the response ends `incomplete`, with the text that came."""
        if choices[0].finish is not None:
            return []
        response = dict(self.started or {"id": exchange.id, "object": "response", "model": exchange.model})
        part = {"type": "output_text", "text": "".join(choices[0].texts), "annotations": []}
        response.update(status="incomplete", incomplete_details={"reason": "stopped"}, output=[
            {"id": self.item_id or "msg_" + secrets.token_hex(12), "type": "message", "status": "incomplete",
             "role": "assistant", "content": [part]}])
        doc = {"type": "response.incomplete", "response": response, "sequence_number": self._next()}
        return [{"event": "response.incomplete", "data": dumps(doc)}]

    def failed(self, error: ApiError) -> list[StreamItem]:
        """Responses' `error` event (its `error` object is what the `openai` client raises on)."""
        doc = {"type": "error", "code": error.code, "message": error.message, "param": error.param,
               "sequence_number": self._next(), **error.body()}
        return [{"event": "error", "data": dumps(doc)}]


def _text_parts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The `output_text` parts of a response's message items."""
    output = doc.get("output")
    if output is None:
        return []
    if not isinstance(output, list):
        raise BadUpstream("answered with a response whose output is not a list")
    parts = []
    for item in output:
        if not isinstance(item, dict):
            raise BadUpstream(f"answered with an output item that is not an object: {repr(item)[:60]}")
        content = item.get("content") if item.get("type") == "message" else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                parts.append(part)
    return parts


def _feed(choice: UpstreamChoice, text: Any, logprobs: Any, *, whole: bool) -> list[TokenEvent]:
    """One piece of output text (and its log-probs, chat's per-token shape) into the record; without
    log-probs the piece is recorded as text alone."""
    text = text if isinstance(text, str) else ""
    if isinstance(logprobs, list) and logprobs:
        try:
            if whole:
                return choice.feed({"message": {"content": text}, "logprobs": {"content": logprobs}}, whole=True)
            return choice.feed({"delta": {"content": text}, "logprobs": {"content": logprobs}})
        except ServerError as e:  # values the remote backend's readers refuse: the text alone is recorded
            log.warning("the upstream's log-probs could not be read: %s", e)
    return choice.feed({"delta": {"content": text}})  # text alone: one text piece, log-prob unknown


def _words(doc: dict[str, Any]) -> str:
    err = doc.get("error")
    message = err.get("message") if isinstance(err, dict) else doc.get("message")
    return str(message or "no reason given")[:300]
