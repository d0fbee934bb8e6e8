"""Proxy mode's reading of Anthropic's Messages API (`/v1/messages`, engine.serve.proxy): what to record.

Anthropic's API has no log-probs, so the body goes to the upstream as the client sent it and the record
holds the answer's text pieces (each stream `text_delta`, or each text block of a whole message) with an
unknown log-prob and no alternatives (the trace says `upstream_top_n: null`); its end from `stop_reason`
(`max_tokens`: "length", `tool_use`: "tool_calls", else "stop"), its prompt tokens from `usage` (computed and
cache-read input tokens together); an `error` event is the record's error. Events pass with their names
and their data unchanged; the stream has no `[DONE]`. Errors are Anthropic's shape (the route renders them).
"""

from __future__ import annotations

from typing import Any

from engine.events import TokenEvent
from engine.request import Message
from engine.serve.anthropic_shape import error_body
from engine.serve.errors import ApiError
from engine.serve.exchange import ServedExchange
from engine.serve.proxy_events import UpstreamChoice
from engine.serve.proxy_messages_text import anthropic_messages
from engine.serve.proxy_read import BadUpstream
from engine.serve.service import dumps

StreamItem = Any
_FINISH = {"max_tokens": "length", "tool_use": "tool_calls"}


class MessagesShape:
    """One Messages request through the proxy (one answer)."""

    endpoint = "messages"
    path = "/messages"
    id_prefix = "msg_"
    done: tuple[StreamItem, ...] = ()
    asked_top = None  # no log-probs in this API

    def __init__(self, endpoint: str, body: dict[str, Any]) -> None:
        self.body = body
        self.prompt_tokens = 0
        self.error: str | None = None
        self.open_block: int | None = None  # the content block a stream has open

    def new_choices(self) -> list[UpstreamChoice]:
        return [UpstreamChoice()]

    def exchange_fields(self) -> tuple[tuple[Message, ...] | None, str | None]:
        return anthropic_messages(self.body), None

    def records(self, exchange: ServedExchange) -> list[ServedExchange]:
        return [exchange]

    def forwarded(self, top: int) -> dict[str, Any]:
        return self.body

    def whole(self, doc: Any, choices: list[UpstreamChoice]) -> None:
        if not isinstance(doc, dict):
            raise BadUpstream(f"answered with JSON that is not a message object: {repr(doc)[:60]}")
        content = doc.get("content")
        if content is not None and not isinstance(content, list):
            raise BadUpstream("answered with a message whose content is not a list")
        for block in content or []:
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                choices[0].feed({"delta": {"content": block["text"]}})
        self._usage(doc.get("usage"))
        self._stop(doc.get("stop_reason"), choices[0])

    def event(self, name: str | None, doc: Any,
              choices: list[UpstreamChoice]) -> list[tuple[int, list[TokenEvent]]]:
        if not isinstance(doc, dict):
            raise BadUpstream(f"streamed an event that is not a JSON object: {repr(doc)[:60]}")
        kind = doc.get("type") if isinstance(doc.get("type"), str) else name
        if kind == "content_block_delta":
            delta = doc.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                return [(0, choices[0].feed({"delta": {"content": delta["text"]}}))]
        elif kind == "content_block_start":
            self.open_block = doc.get("index") if isinstance(doc.get("index"), int) else 0
        elif kind == "content_block_stop":
            self.open_block = None
        elif kind == "message_start" and isinstance(doc.get("message"), dict):
            self._usage(doc["message"].get("usage"))
        elif kind == "message_delta":
            self._usage(doc.get("usage"))
            delta = doc.get("delta")
            self._stop(delta.get("stop_reason") if isinstance(delta, dict) else None, choices[0])
        elif kind == "error":
            err = doc.get("error")
            words = err.get("message") if isinstance(err, dict) else None
            self.error = f"the upstream's stream said: {str(words or 'no reason given')[:300]}"
        return []

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        counts = [usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
        total = sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 0)
        if total:
            self.prompt_tokens = total

    @staticmethod
    def _stop(reason: Any, choice: UpstreamChoice) -> None:
        if isinstance(reason, str):
            choice.finish = _FINISH.get(reason, "stop")

    def passed(self, name: str | None, data: str) -> StreamItem:
        return {"event": name, "data": data} if name else {"data": data}

    def stopped(self, exchange: ServedExchange, choices: list[UpstreamChoice]) -> list[StreamItem]:
        """After the window's Stop: the open block closes and the message ends as a finished turn."""
        if choices[0].finish is not None:
            return []
        out = []
        if self.open_block is not None:
            out.append({"event": "content_block_stop",
                        "data": dumps({"type": "content_block_stop", "index": self.open_block})})
        out.append({"event": "message_delta", "data": dumps({
            "type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": len(choices[0].events)}})})
        out.append({"event": "message_stop", "data": dumps({"type": "message_stop"})})
        return out

    def failed(self, error: ApiError) -> list[StreamItem]:
        return [{"event": "error", "data": dumps(error_body(error))}]
