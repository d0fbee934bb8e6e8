"""OpenAI Responses API documents: the response object, its message item, usage, and the stream's events.

A response holds one output item, the assistant's message, with one `output_text` part (its `logprobs` when
asked: each token's `{token, logprob, bytes, top_logprobs}` as in chat, engine.serve.responses.chat_logprob).
`status` is "completed", or "incomplete" with `incomplete_details.reason` "max_output_tokens" when the answer
reached its length. A stream sends, each with its `sequence_number` (0, 1, ...): `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`, one
`response.output_text.delta` per token that shows text (or carries log-probs), `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`, then `response.completed` (or `response.incomplete`),
or `response.failed` with the error when the model failed after the stream began.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events import GenerationStats, TokenEvent
from engine.request import Message
from engine.serve.adapted import Sse, sse
from engine.serve.errors import ApiError
from engine.serve.exchange import ServedExchange
from engine.serve.parse import ServedRequest
from engine.serve.responses import chat_logprob
from engine.serve.responses_tools import call_item
from engine.serve.tool_calls import ToolStream, answer_parts, tool_streams
from engine.tools import ToolCall


@dataclass(frozen=True)
class ResponseAsk:
    """What a Responses request asked, beyond the chat request it was read into (echoed in the response)."""

    response_id: str
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    store: bool
    metadata: dict[str, str]
    logprobs: bool
    text_format: dict[str, Any]
    user: str | None
    conversation: tuple[Message, ...] = field(repr=False)  # input (after the previous response's), no instructions
    tools: tuple[Any, ...] = ()  # as given (echoed in the response)
    tool_choice: Any = "auto"


def _response(ask: ResponseAsk, served: ServedRequest, created: int, status: str) -> dict[str, Any]:
    sampler = served.sampler
    return {
        "id": ask.response_id, "object": "response", "created_at": created, "status": status, "background": False,
        "error": None, "incomplete_details": None, "instructions": ask.instructions,
        "max_output_tokens": ask.max_output_tokens, "max_tool_calls": None, "model": served.model, "output": [],
        "parallel_tool_calls": True, "previous_response_id": ask.previous_response_id,
        "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "store": ask.store,
        "temperature": sampler.temperature, "text": {"format": ask.text_format}, "tool_choice": ask.tool_choice,
        "tools": list(ask.tools),
        "top_logprobs": served.top_logprobs or 0, "top_p": sampler.top_p, "truncation": "disabled", "usage": None,
        "user": ask.user, "metadata": ask.metadata,
    }


def _part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def response_doc(ask: ResponseAsk, served: ServedRequest, exchange: ServedExchange, cached: int,
                 created: int | None = None, item_id: str | None = None) -> dict[str, Any]:
    """The whole response for the answer `exchange` recorded: its message (when it has text or no calls), then
    a `function_call` item per call."""
    choice = exchange.choices[0] if exchange.choices else None
    events = list(choice.events) if choice is not None else []
    incomplete = choice is not None and choice.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    doc = _response(ask, served, created or int(exchange.started_at), status)
    if incomplete:
        doc["incomplete_details"] = {"reason": "max_output_tokens"}
    lps = [chat_logprob(e, served) for e in events if not e.special] if ask.logprobs else None
    text, calls = answer_parts(exchange, served.tools)
    message = [_item(item_id or "msg_" + secrets.token_hex(12), status, [_part(text, lps)])] if text or not calls \
        else []
    doc["output"] = message + [call_item(c) for c in calls]
    doc["usage"] = {"input_tokens": len(served.prompt_ids), "input_tokens_details": {"cached_tokens": cached},
                    "output_tokens": len(events), "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": len(served.prompt_ids) + len(events)}
    return doc


class ResponsesStream:
    """One streamed response's events (engine.serve.adapted.AdaptedStream); `on_done` gets the finished record.

    Without tools the message item opens with the stream. With tools an answer may be a call, so items open as
    the answer shows what it is (`ToolStream`, the chat path's reading of calls as they come): text opens the
    message item, a call's name a `function_call` item whose arguments follow as
    `response.function_call_arguments.delta` events, closed by `...arguments.done` and `output_item.done`.
    """

    def __init__(self, ask: ResponseAsk, served: ServedRequest, on_done: Callable[[ServedExchange], None]) -> None:
        self.ask = ask
        self.served = served
        self.on_done = on_done
        self.created = int(time.time())
        self.item_id = "msg_" + secrets.token_hex(12)
        self.sequence = 0
        streams = tool_streams(served.tools, 1)
        self.calls: ToolStream | None = streams[0] if streams else None
        self.output_index = -1  # the item open now (-1: none yet)
        self.open: str | None = None  # "message" or "call"
        self.text = ""  # the message's text sent
        self.lps: list[dict[str, Any]] = []
        self.call: ToolCall | None = None  # the call open now, and its arguments sent
        self.args = ""

    def _event(self, kind: str, **fields: Any) -> Sse:
        doc = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return sse(kind, doc)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": self.output_index, "content_index": 0}

    def opening(self) -> list[Sse]:
        started = _response(self.ask, self.served, self.created, "in_progress")
        out = [self._event("response.created", response=started),
               self._event("response.in_progress", response=started)]
        return out if self.calls is not None else out + self._open_message()

    def _open_message(self) -> list[Sse]:
        if self.open == "message":
            return []
        out = self._close_item()
        self.open, self.output_index = "message", self.output_index + 1
        return out + [self._event("response.output_item.added", output_index=self.output_index,
                                  item=_item(self.item_id, "in_progress", [])),
                      self._event("response.content_part.added", **self._where(),
                                  part=_part("", [] if self.ask.logprobs else None))]

    def _text(self, text: str, lps: list[dict[str, Any]]) -> list[Sse]:
        self.text += text
        self.lps += lps
        return [self._event("response.output_text.delta", **self._where(), delta=text, logprobs=lps)]

    def token(self, event: TokenEvent) -> list[Sse]:
        if event.special:
            return []  # the model's end: not part of the text
        lps = [chat_logprob(event, self.served)] if self.ask.logprobs else []
        if self.calls is not None:
            read = self.calls.feed(event, lps[0] if lps else None)
            return self._deltas([read[0]], read[1]) if read is not None else []
        if not event.text and not lps:
            return []  # text held back (a character's first bytes, a possible stop string): it comes later
        return self._text(event.text, lps)

    def _deltas(self, deltas: list[dict[str, Any]], lps: list[dict[str, Any]]) -> list[Sse]:
        """The events of the chat path's deltas (`content`, or `tool_calls` headers and argument fragments)."""
        out: list[Sse] = []
        for delta in deltas:
            if "content" in delta:
                out += self._open_message() + self._text(delta["content"], lps)
                lps = []
            for part in delta.get("tool_calls", ()):
                fn = part.get("function", {})
                if "id" in part:
                    out += self._close_item()
                    self.call, self.args = ToolCall(fn.get("name", ""), "", part["id"]), ""
                    self.open, self.output_index = "call", self.output_index + 1
                    out.append(self._event("response.output_item.added", output_index=self.output_index,
                                           item=call_item(self.call, "in_progress", "")))
                if fn.get("arguments") and self.call is not None:
                    self.args += fn["arguments"]
                    out.append(self._event("response.function_call_arguments.delta", item_id="fc_" + self.call.id,
                                           output_index=self.output_index, delta=fn["arguments"]))
        return out

    def _close_item(self) -> list[Sse]:
        """The events that close the item open now (none when none is)."""
        kind, self.open = self.open, None
        if kind == "message":
            part = _part(self.text, self.lps if self.ask.logprobs else None)
            return [self._event("response.output_text.done", **self._where(), text=self.text,
                                logprobs=self.lps),
                    self._event("response.content_part.done", **self._where(), part=part),
                    self._event("response.output_item.done", output_index=self.output_index,
                                item=_item(self.item_id, "completed", [part]))]
        if kind == "call" and self.call is not None:
            done = call_item(self.call, "completed", self.args)
            return [self._event("response.function_call_arguments.done", item_id=done["id"],
                                output_index=self.output_index, arguments=self.args),
                    self._event("response.output_item.done", output_index=self.output_index, item=done)]
        return []

    def recorded(self, stats: GenerationStats) -> GenerationStats:
        """The stats as recorded: a streamed call keeps the id the client was sent."""
        return self.calls.recorded(stats) if self.calls is not None else stats

    def closing(self, exchange: ServedExchange, cached: int) -> list[Sse]:
        doc = response_doc(self.ask, self.served, exchange, cached, self.created, self.item_id)
        self.on_done(exchange)
        out: list[Sse] = []
        if self.calls is not None:
            choice = exchange.choices[0] if exchange.choices else None
            deltas, lps = self.calls.finish(choice.stats if choice is not None else None)
            out += self._deltas(deltas, lps)
            if self.output_index < 0:
                out += self._open_message()  # an empty answer still has its (empty) message
        elif doc["output"]:  # the whole text and log-probs (held-back pieces included)
            part = doc["output"][0]["content"][0]
            self.text, self.lps = part["text"], part.get("logprobs", [])
        streamed = self.call
        out += self._close_item()
        for item in doc["output"]:  # the call's arguments as streamed (the record's are the same object, re-written)
            if streamed is not None and item["type"] == "function_call" and item["call_id"] == streamed.id:
                item["arguments"] = self.args or item["arguments"]
        kind = "response.incomplete" if doc["status"] == "incomplete" else "response.completed"
        return out + [self._event(kind, response=doc)]

    def failed(self, error: ApiError) -> list[Sse]:
        doc = _response(self.ask, self.served, self.created, "failed")
        doc["error"] = {"code": error.code or "server_error", "message": error.message}
        return [self._event("response.failed", response=doc)]
