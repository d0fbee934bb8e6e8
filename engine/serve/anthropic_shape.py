"""Anthropic Messages API documents: the message, usage, the stream's events and errors.

A message's `content` is a `text` block, and with tools a `tool_use` block per call (engine.serve.anthropic_tools);
`stop_reason` is "end_turn" (the model's end, or the window's Stop), "max_tokens" (the answer reached
`max_tokens`), "stop_sequence" (with the `stop_sequence` that matched) or "tool_use" (the answer is a call).
Usage as Anthropic counts it: `input_tokens` the prompt's tokens computed for this answer,
`cache_read_input_tokens` those reused from the model's cache (their sum is `count_tokens`' figure),
`output_tokens` the answer's. A stream: `message_start`, `content_block_start`, `ping`, a `content_block_delta`
(`text_delta`) per token that shows text, `content_block_stop`, `message_delta` (stop reason and usage),
`message_stop`; an error after it began is an `error` event. Errors: `{"type": "error", "error": {"type",
"message"}}` with the HTTP status (the `anthropic` client makes its exception of the status).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from engine.events import GenerationStats, TokenEvent
from engine.serve.adapted import Sse, sse, stop_string
from engine.serve.errors import ApiError, SafeJSONResponse
from engine.serve.exchange import ServedExchange
from engine.serve.anthropic_tools import tool_use_block
from engine.serve.parse import ServedRequest
from engine.serve.tool_calls import ToolStream, answer_parts, tool_streams

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(e: ApiError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def error_response(e: ApiError) -> JSONResponse:
    """An ApiError in Anthropic's shape (the same status and headers as OpenAI's)."""
    headers = {"Connection": "close"} if e.close else None
    return SafeJSONResponse(error_body(e), status_code=e.status, headers=headers)


def stop_reason(exchange: ServedExchange) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of the first answer."""
    choice = exchange.choices[0] if exchange.choices else None
    if choice is not None and choice.finish_reason == "length":
        return "max_tokens", None
    if choice is not None and choice.finish_reason == "tool_calls":
        return "tool_use", None
    matched = stop_string(exchange)
    return ("stop_sequence", matched) if matched is not None else ("end_turn", None)


def _usage(served: ServedRequest, output_tokens: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": len(served.prompt_ids) - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": output_tokens}


def _message(message_id: str, served: ServedRequest) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": served.model, "content": [],
            "stop_reason": None, "stop_sequence": None}


def message_doc(served: ServedRequest, exchange: ServedExchange, cached: int) -> dict[str, Any]:
    """The whole message for the answer `exchange` recorded."""
    choice = exchange.choices[0] if exchange.choices else None
    doc = _message(exchange.id, served)
    text, calls = answer_parts(exchange, served.tools)
    doc["content"] = ([{"type": "text", "text": text}] if text or not calls else []) + \
        [tool_use_block(c) for c in calls]
    doc["stop_reason"], doc["stop_sequence"] = stop_reason(exchange)
    doc["usage"] = _usage(served, len(choice.events) if choice is not None else 0, cached)
    return doc


class MessagesStream:
    """One streamed message's events (engine.serve.adapted.AdaptedStream).

    Without tools the text block opens with the stream. With tools blocks open as the answer shows what it is
    (`ToolStream`, the chat path's reading of calls as they come): text opens a text block, a call's name a
    `tool_use` block whose input follows as `input_json_delta` events (the arguments' JSON text in pieces).
    """

    def __init__(self, message_id: str, served: ServedRequest) -> None:
        self.id = message_id
        self.served = served
        streams = tool_streams(served.tools, 1)
        self.calls: ToolStream | None = streams[0] if streams else None
        self.index = -1  # the block open now (-1: none yet)
        self.open: str | None = None  # "text" or "tool_use"

    def opening(self) -> list[Sse]:
        start = _message(self.id, self.served)
        start["usage"] = _usage(self.served, 0, 0)  # the reuse is known at the end (message_delta says it)
        out = [sse("message_start", {"type": "message_start", "message": start})]
        if self.calls is None:
            out += self._open("text", {"type": "text", "text": ""})
        return out + [sse("ping", {"type": "ping"})]

    def _open(self, kind: str, block: dict[str, Any]) -> list[Sse]:
        out = self._close()
        self.index, self.open = self.index + 1, kind
        return out + [sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": block})]

    def _close(self) -> list[Sse]:
        if self.open is None:
            return []
        self.open = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> Sse:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def token(self, event: TokenEvent) -> list[Sse]:
        if self.calls is not None:
            read = self.calls.feed(event, None)
            return self._deltas([read[0]]) if read is not None else []
        if event.special or not event.text:
            return []  # the model's end, or text held back (a character's first bytes, a possible stop string)
        return [self._delta({"type": "text_delta", "text": event.text})]

    def _deltas(self, deltas: list[dict[str, Any]]) -> list[Sse]:
        """The events of the chat path's deltas (`content`, or `tool_calls` headers and argument fragments)."""
        out: list[Sse] = []
        for delta in deltas:
            if delta.get("content"):
                if self.open != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for part in delta.get("tool_calls", ()):
                fn = part.get("function", {})
                if "id" in part:
                    out += self._open("tool_use", {"type": "tool_use", "id": part["id"], "name": fn.get("name", ""),
                                                   "input": {}})
                if fn.get("arguments"):
                    out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def recorded(self, stats: GenerationStats) -> GenerationStats:
        """The stats as recorded: a streamed call keeps the id the client was sent."""
        return self.calls.recorded(stats) if self.calls is not None else stats

    def closing(self, exchange: ServedExchange, cached: int) -> list[Sse]:
        reason, sequence = stop_reason(exchange)
        choice = exchange.choices[0] if exchange.choices else None
        out: list[Sse] = []
        if self.calls is not None:
            out += self._deltas(self.calls.finish(choice.stats if choice is not None else None)[0])
            if self.index < 0:
                out += self._open("text", {"type": "text", "text": ""})  # an empty answer: one empty text block
        usage = _usage(self.served, len(choice.events) if choice is not None else 0, cached)
        return out + self._close() + [
            sse("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}),
            sse("message_stop", {"type": "message_stop"})]

    def failed(self, error: ApiError) -> list[Sse]:
        return [sse("error", error_body(error))]
