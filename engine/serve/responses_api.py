"""`POST /v1/responses` (OpenAI's Responses API) as a thin adapter over the one service.

The body is read into a chat request and checked by the chat path (engine.serve.parse: sampler fields through
the llama.cpp mapping, limits, the model's context), so a field means here what it means in a chat request:
`input` (a string, or a list of message items with `input_text` / `output_text` parts) and `instructions`
become the messages, `max_output_tokens` the answer's length, `text.format` the constraint, the sampler
fields (OpenAI's `temperature`, `top_p`, and llama.cpp server's `top_k`, `min_p`, ...) the sampler.
`include: ["message.output_text.logprobs"]` (or `top_logprobs`) puts each token's log-prob, with `top_logprobs`
alternatives, in the output text. `previous_response_id` continues a response this server gave and kept
(`store`, true by default; `ResponseStore`). Function tools (`tools`, `tool_choice`, `function_call` and
`function_call_output` input items) go to the chat path's tool calling (engine.serve.responses_tools); a call
comes back as a `function_call` output item. What it cannot honour (hosted tools, `background`, reasoning, other
`include` entries, images and files, other input items) is a 400 in words, in Responses' error shape
(OpenAI's: `{"error": {"message", "type", "param", "code"}}`); an unknown stored id is a 404. In proxy mode
the body goes to the upstream's own /v1/responses (engine.serve.proxy_responses).
Documents and stream events: engine.serve.responses_shape.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.request import Message
from engine.tools.render import ToolPlan
from engine.serve import adapted
from engine.serve import fields as f
from engine.serve.errors import ApiError, bad_field, refused
from engine.serve.exchange import ServedExchange
from engine.serve.limits import MAX_MESSAGES, MAX_TOP_LOGPROBS
from engine.serve.parse import SAMPLER_KEYS, ParseContext, ServedRequest, parse_request
from engine.serve.responses_shape import ResponseAsk, ResponsesStream, response_doc
from engine.serve.responses_tools import add_tool_item, chat_tool_fields, stored_answer
from engine.serve.tool_calls import answer_parts
from engine.serve.service import EngineService

# Passed to the chat path as they are: the sampler fields (OpenAI's and llama.cpp server's) and llama.cpp's
# ignore_eos (an answer of exactly its length, for tests and benchmarks).
PASSED_KEYS = SAMPLER_KEYS | {"ignore_eos"}

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Asks that reasoning items carry their encrypted content (Codex sends it): honoured as given, since this server
# makes no reasoning items.
NO_OP_INCLUDES = frozenset({"reasoning.encrypted_content"})
MAX_STORED = 256  # responses kept for previous_response_id, the oldest dropped first
MAX_STORED_CHARS = 32 * 2**20  # and at most this many characters of their conversations in all

RESPONSES_KEYS = frozenset({
    "model", "input", "instructions", "stream", "stream_options", "max_output_tokens", "top_logprobs", "include",
    "previous_response_id", "store", "metadata", "user", "tools", "tool_choice", "parallel_tool_calls",
    "max_tool_calls", "background", "reasoning", "text", "truncation", "service_tier", "prompt_cache_key",
    "safety_identifier", "conversation", "prompt",
})
# The chat path's names for what a Responses client calls otherwise (its errors are told in the client's words).
_CHAT_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


@dataclass
class ResponseStore:
    """The server's own responses, kept in memory for `previous_response_id`: each response's conversation
    (its input, without its instructions, as OpenAI's API does, then its answer), bounded in count and size."""

    kept: OrderedDict[str, tuple[Message, ...]] = field(default_factory=OrderedDict)
    chars: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, response_id: str, conversation: tuple[Message, ...]) -> None:
        size = sum(len(m.get("content", "")) for m in conversation)
        with self.lock:
            self.kept[response_id] = conversation
            self.chars += size
            while len(self.kept) > MAX_STORED or (self.chars > MAX_STORED_CHARS and len(self.kept) > 1):
                _, dropped = self.kept.popitem(last=False)
                self.chars -= sum(len(m.get("content", "")) for m in dropped)

    def get(self, response_id: str) -> tuple[Message, ...]:
        with self.lock:
            found = self.kept.get(response_id)
        if found is None:
            raise ApiError(404, f"there is no stored response {response_id[:80]!r} here: this server keeps its last "
                                f"{MAX_STORED} responses given with store on, in memory, until it stops",
                           param="previous_response_id", code="response_not_found")
        return found


class ResponsesApi:
    """The route's work: read, run on the service, answer whole or streamed, keep the response."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.store = ResponseStore()

    async def answer(self, body: dict[str, Any], request: Request) -> Response:
        service = self.service
        if not isinstance(service, EngineService):  # proxy mode: the upstream answers (engine.serve.proxy_responses)
            response: Response = await service.answer("responses", body, request)
            return response
        served, ask = await asyncio.to_thread(read_request, body, service.context, self.store)
        active = adapted.begin(service, "responses", served, body, request, "resp_")
        ask = replace(ask, response_id=active.exchange.id)
        if served.stream:
            writer = ResponsesStream(ask, served, on_done=self._keep(ask, served.tools))
            return EventSourceResponse(adapted.stream(service, active, served, writer), ping=15)
        try:
            exchange = await adapted.whole(service, active, served, request)
        except adapted.ClientLeft:
            return Response(status_code=499)
        doc = response_doc(ask, served, exchange, adapted.cached_tokens(active.stats))
        self._keep(ask, served.tools)(exchange)
        return JSONResponse(doc)

    def _keep(self, ask: ResponseAsk, plan: ToolPlan | None) -> Callable[[ServedExchange], None]:
        def keep(exchange: ServedExchange) -> None:
            if ask.store and exchange.error is None and not exchange.disconnected and exchange.choices:
                text, calls = answer_parts(exchange, plan)
                self.store.put(ask.response_id, ask.conversation + (stored_answer(text, calls),))
        return keep


def read_request(body: dict[str, Any], ctx: ParseContext, store: ResponseStore) -> tuple[ServedRequest, ResponseAsk]:
    """Check a Responses body and read it through the chat path; raises ApiError (400/404) in words."""
    unknown = sorted(k for k in body if k not in RESPONSES_KEYS and k not in PASSED_KEYS)
    if unknown:
        raise ApiError(400, f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: this "
                            "server does not know it, and does not ignore what it does not know (docs/serve.md "
                            "lists the fields /v1/responses takes)", param=unknown[0], code="unknown_parameter")
    _refuse_unsupported(body)
    stream = f.flag(body, "stream")
    options = f.obj(body, "stream_options")
    if options is not None:
        if not stream:
            raise bad_field("stream_options", "stream_options is only allowed with stream: true")
        extra = sorted(set(options) - {"include_obfuscation"})
        if extra:
            raise refused("stream_options", f"stream_options {', '.join(map(repr, extra))} is not supported here")
        f.flag(options, "include_obfuscation")  # random padding against length side channels: none is needed here
    store_it = f.flag(body, "store", True)
    metadata = _metadata(body)
    for name in ("user", "prompt_cache_key", "safety_identifier", "instructions", "previous_response_id"):
        f.text(body, name)
    logprobs = _include(body)
    top = f.whole(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    previous_id = body.get("previous_response_id") or None
    earlier = store.get(previous_id) if previous_id else ()
    given = _input(body.get("input"))
    conversation = earlier + given
    instructions = body.get("instructions") or None
    messages = ((({"role": "system", "content": instructions},) if instructions else ()) + conversation)
    if len(messages) > MAX_MESSAGES:
        raise bad_field("input", f"the conversation has {len(messages):,} messages; this server takes at most "
                                 f"{MAX_MESSAGES:,}")
    chat: dict[str, Any] = {k: v for k, v in body.items() if k in PASSED_KEYS}
    chat.update(messages=list(messages), model=body.get("model"), user=body.get("user"),
                max_tokens=body.get("max_output_tokens"))
    fmt = _format(body)
    if fmt is not None:
        chat["response_format"] = fmt
    if logprobs or top is not None:
        chat.update(logprobs=True, top_logprobs=top or 0)
    chat.update(chat_tool_fields(body))
    try:
        served = parse_request("chat.completions", {k: v for k, v in chat.items() if v is not None}, ctx)
    except ApiError as e:
        raise _in_responses_words(e) from None
    served = replace(served, stream=stream)
    ask = ResponseAsk(response_id="", instructions=instructions, previous_response_id=previous_id,
                      max_output_tokens=body.get("max_output_tokens"), store=store_it, metadata=metadata,
                      logprobs=served.top_logprobs is not None, text_format=fmt or {"type": "text"},
                      user=body.get("user"), conversation=conversation, tools=tuple(body.get("tools") or ()),
                      tool_choice=body.get("tool_choice") or "auto")
    return served, ask


def _in_responses_words(e: ApiError) -> ApiError:
    """A chat-path error said with the Responses field names (max_tokens -> max_output_tokens, ...)."""
    message = e.message
    for chat_name, name in _CHAT_NAMES.items():
        message = message.replace(chat_name, name)
    param = e.param
    for chat_name, name in _CHAT_NAMES.items():
        if param is not None and param.startswith(chat_name):
            param = name + param[len(chat_name):]
    return ApiError(e.status, message, param=param, code=e.code, type=e.type)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    f.flag(body, "parallel_tool_calls")
    f.whole(body, "max_tool_calls", 0, 2**31 - 1)
    if f.flag(body, "background"):
        raise refused("background", "background responses are not supported here: ask without background (stream "
                                    "to see the answer as it comes)")
    reasoning = f.obj(body, "reasoning")
    if reasoning and any(v is not None for v in reasoning.values()):
        raise refused("reasoning", "reasoning options are not supported here: this server's models give no "
                                   "reasoning items; send the request without reasoning")
    if body.get("conversation") is not None:
        raise refused("conversation", "conversations are not kept here; continue a response with "
                                      "previous_response_id")
    if body.get("prompt") is not None:
        raise refused("prompt", "stored prompt templates are not supported here; send the input itself")
    truncation = f.text(body, "truncation")
    if truncation not in (None, "disabled"):
        raise refused("truncation", f"truncation {truncation!r} is not supported here (only 'disabled': a "
                                    "conversation past the model's context is a 400)")
    tier = f.text(body, "service_tier")
    if tier not in (None, "auto", "default"):
        raise refused("service_tier", f"service_tier {tier!r} is not offered here (one tier: 'default')")


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    meta = f.obj(body, "metadata") or {}
    if len(meta) > 16 or not all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in meta.items()):
        raise bad_field("metadata", "metadata takes at most 16 string values (keys of at most 64 characters, values "
                                    "of at most 512)")
    return meta


def _include(body: dict[str, Any]) -> bool:
    """Whether the output text carries log-probs; any other `include` entry is refused."""
    value = body.get("include")
    if value is None:
        return False
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 16:
        raise bad_field("include", "include must be a list of strings, like [\"message.output_text.logprobs\"]")
    other = [v for v in value if v != LOGPROBS_INCLUDE and v not in NO_OP_INCLUDES]
    if other:
        raise refused("include", f"include {other[0][:60]!r} is not supported here (only {LOGPROBS_INCLUDE!r})")
    return LOGPROBS_INCLUDE in value


def _format(body: dict[str, Any]) -> dict[str, Any] | None:
    """`text.format` as the chat path's `response_format` (None: plain text)."""
    text = f.obj(body, "text")
    if text is None:
        return None
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise refused("text", f"text {', '.join(map(repr, extra))} is not supported here (only format)")
    if text.get("verbosity") not in (None, "medium"):
        raise refused("text.verbosity", "text.verbosity is not supported here (the model says what it says)")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_field("text.format", "text.format must be an object like {\"type\": \"text\"}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad_field("text.format", 'text.format json_schema needs {"type": "json_schema", "name": ..., '
                                           '"schema": {...}}')
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": schema}}
    raise bad_field("text.format", f"text.format type {str(kind)[:40]!r} is not known; use text, json_object or "
                                   "json_schema")


def _input(value: Any) -> tuple[Message, ...]:
    """`input` as messages: a string is one user message; a list holds message items."""
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise bad_field("input", 'input must be a string or a non-empty list of messages like '
                                 '[{"role": "user", "content": "Hi"}]')
    if len(value) > MAX_MESSAGES:
        raise bad_field("input", f"input has {len(value):,} items; this server takes at most {MAX_MESSAGES:,}")
    out: list[Message] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_field(where, f"{where} must be an object with a role and content")
        kind = item.get("type", "message")
        if kind in ("function_call", "function_call_output"):
            add_tool_item(out, item, where)  # a tool loop's call and its result (engine.serve.responses_tools)
            continue
        if kind != "message":
            raise refused(where, f"{where} is an item of type {repr(kind)[:40]}: this server reads message, "
                                 "function_call and function_call_output items")
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise refused(f"{where}.role", f"{where} has role {repr(role)[:40]}: roles are user, assistant, system "
                                           "and developer")
        extra = sorted(set(item) - {"type", "role", "content", "id", "status"})
        if extra:
            raise refused(where, f"{where} has {', '.join(map(repr, extra))}, which this server does not support")
        out.append({"role": role, "content": _content(item.get("content"), where)})
    return tuple(out)


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_field(f"{where}.content", f"{where}.content must be a string or a list of input_text parts")
    parts = []
    for j, part in enumerate(content):
        here = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise refused(here, f"{here} is {repr(kind)[:40]}: this server reads text parts only (input_text, "
                                "output_text; no images, files or audio)")
        parts.append(part["text"])
    return "".join(parts)

