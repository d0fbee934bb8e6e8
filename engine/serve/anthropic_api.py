"""`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages API) as a thin adapter over the service.

The body is read into a chat request and checked by the chat path (engine.serve.parse: the sampler fields
through the llama.cpp mapping, limits, the model's context): `system` (a string or text blocks) and `messages`
(user and assistant turns, a string or text blocks each) become the messages, `max_tokens` (required, as
Anthropic's API has it) the answer's length, `stop_sequences` the stop strings, `temperature` / `top_p` /
`top_k` (and llama.cpp server's other sampler fields) the sampler; `tools`, `tool_choice` and the `tool_use` /
`tool_result` blocks go to the chat path's tool calling (engine.serve.anthropic_tools). What it cannot honour
(images and documents, server tools, extended thinking, an assistant turn to continue) is a 400 in words; every error is in
Anthropic's shape (engine.serve.anthropic_shape). Documents and stream events: engine.serve.anthropic_shape.
In proxy mode both routes go to the upstream's own (engine.serve.proxy_messages).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.decode.loop import prompt_ids_for
from engine.errors import EngineError
from engine.request import GenerationRequest, Message
from engine.serve import adapted
from engine.serve import fields as f
from engine.serve.anthropic_shape import MessagesStream, message_doc
from engine.serve.anthropic_tools import chat_tool_fields, has_tool_blocks, tool_turn
from engine.serve.errors import ApiError, bad_field, refused
from engine.serve.limits import MAX_MESSAGES
from engine.serve.parse import SAMPLER_KEYS, ParseContext, ServedRequest, check_model, parse_request
from engine.serve.service import EngineService
from engine.serve.tool_calls import read_tool_fields

# Passed to the chat path as they are: the sampler fields (OpenAI's and llama.cpp server's) and llama.cpp's
# ignore_eos (an answer of exactly its length, for tests and benchmarks).
PASSED_KEYS = SAMPLER_KEYS | {"ignore_eos"}

MESSAGES_KEYS = frozenset({"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                           "top_p", "top_k", "metadata", "tools", "tool_choice", "thinking", "service_tier",
                           "cache_control", "output_config"})
COUNT_KEYS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
_TEXT_BLOCK_KEYS = {"type", "text", "cache_control", "citations"}  # a prompt-cache hint: every prompt is cached here


class AnthropicApi:
    """The routes' work: read, run on the service, answer whole or streamed; count a prompt's tokens."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def answer(self, body: dict[str, Any], request: Request) -> Response:
        service = self.service
        if not isinstance(service, EngineService):  # proxy mode: the upstream answers (engine.serve.proxy_messages)
            response: Response = await service.answer("messages", body, request)
            return response
        served = await asyncio.to_thread(read_request, body, service.context)
        active = adapted.begin(service, "messages", served, body, request, "msg_")
        if served.stream:
            writer = MessagesStream(active.exchange.id, served)
            return EventSourceResponse(adapted.stream(service, active, served, writer), ping=15)
        try:
            exchange = await adapted.whole(service, active, served, request)
        except adapted.ClientLeft:
            return Response(status_code=499)
        return JSONResponse(message_doc(served, exchange, adapted.cached_tokens(active.stats)))

    async def count_tokens(self, body: dict[str, Any]) -> Response:
        service = self.service
        if not isinstance(service, EngineService):  # proxy mode: the upstream counts
            return JSONResponse(await service.count_tokens(body))
        return JSONResponse({"input_tokens": await asyncio.to_thread(count_tokens, body, service.context)})


def _check_keys(body: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    unknown = sorted(k for k in body if k not in allowed and k not in PASSED_KEYS)
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise ApiError(400, f"{unknown[0]}: Extra inputs are not permitted (unknown field{plural} "
                            f"{', '.join(map(repr, unknown))}; docs/serve.md lists the fields {path} takes)",
                       param=unknown[0], code="unknown_parameter")


def _messages(body: dict[str, Any]) -> tuple[Message, ...]:
    """`system` and `messages` as the chat path's messages."""
    _refuse_unsupported(body)
    system = _system(body.get("system"))
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise bad_field("messages", 'messages: Field required: a non-empty list like [{"role": "user", "content": '
                                    '"Hi"}]')
    if len(value) > MAX_MESSAGES:
        raise bad_field("messages", f"messages has {len(value):,} entries; this server takes at most {MAX_MESSAGES:,}")
    out: list[Message] = [{"role": "system", "content": system}] if system else []
    for i, m in enumerate(value):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise bad_field(where, f"{where}: must be an object with a role and content")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad_field(f"{where}.role", f"{where}.role: {repr(role)[:40]} is no role here; roles are user and "
                                             "assistant (the system prompt goes in system)")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise bad_field(where, f"{where}: {', '.join(map(repr, extra))}: Extra inputs are not permitted")
        if has_tool_blocks(m.get("content")):  # calls and their results (engine.serve.anthropic_tools)
            out += tool_turn(role, m["content"], f"{where}.content", _blocks)
        else:
            out.append({"role": role, "content": _blocks(m.get("content"), f"{where}.content")})
    if out[-1]["role"] == "assistant":
        raise refused(f"messages.{len(value) - 1}", "the last message is the assistant's: continuing a partial "
                                                    "assistant turn (prefill) is not supported here; end with a "
                                                    "user message")
    return tuple(out)


def _system(value: Any) -> str:
    if value is None:
        return ""
    return _blocks(value, "system")


def _blocks(content: Any, where: str) -> str:
    """A string, or text blocks joined; any other block is refused in words."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_field(where, f"{where}: must be a string or a list of content blocks like [{{\"type\": \"text\", "
                               "\"text\": \"Hi\"}]")
    parts = []
    for j, block in enumerate(content):
        here = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind == "text" and isinstance(block, dict) and isinstance(block.get("text"), str):
            extra = sorted(set(block) - _TEXT_BLOCK_KEYS)
            if extra:
                raise bad_field(here, f"{here}: {', '.join(map(repr, extra))}: Extra inputs are not permitted")
            parts.append(block["text"])
            continue
        shown = repr(kind)[:40]
        if kind in ("image", "document", "search_result"):
            why = f"{kind} blocks are not supported: this server's models read text only; send text blocks"
        elif kind in ("tool_use", "tool_result"):
            why = f"a {kind} block goes directly in a message's content (an assistant's tool_use, a user's tool_result)"
        elif kind in ("server_tool_use", "web_search_tool_result"):
            why = f"{kind} blocks belong to Anthropic's server tools, which this server does not run"
        elif kind in ("thinking", "redacted_thinking"):
            why = f"{kind} blocks need extended thinking, which this server does not do"
        else:
            why = f"a block of type {shown} is not known here; blocks are text"
        raise refused(here, f"{here}: {why}")
    return "".join(parts)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    f.obj(body, "cache_control")  # a prompt-cache hint: every prompt's tokens are kept in the model's cache here
    if f.obj(body, "output_config"):
        raise refused("output_config", "output_config (effort, structured output) is not supported here; send the "
                                       "request without it")
    thinking = f.obj(body, "thinking")
    if thinking is not None and thinking.get("type") != "disabled":
        raise refused("thinking", "thinking: extended thinking is not supported here; send thinking "
                                  "{\"type\": \"disabled\"} or leave it out")


def read_request(body: dict[str, Any], ctx: ParseContext) -> ServedRequest:
    """Check a Messages body and read it through the chat path; raises ApiError (400/404) in words."""
    _check_keys(body, MESSAGES_KEYS, "/v1/messages")
    messages = _messages(body)
    if body.get("max_tokens") is None:
        raise bad_field("max_tokens", "max_tokens: Field required (the most tokens the answer may have)")
    stream = f.flag(body, "stream")
    meta = f.obj(body, "metadata") or {}
    if set(meta) - {"user_id"} or not isinstance(meta.get("user_id", ""), (str, type(None))):
        raise bad_field("metadata", "metadata takes only user_id, a string")
    tier = f.text(body, "service_tier")
    if tier not in (None, "auto", "standard_only"):
        raise refused("service_tier", f"service_tier: {tier!r} is not offered here (auto, standard_only)")
    stops = body.get("stop_sequences")
    if stops is not None and not isinstance(stops, list):
        raise bad_field("stop_sequences", "stop_sequences: must be a list of strings")
    chat = {k: v for k, v in body.items() if k in PASSED_KEYS}
    chat.update(messages=list(messages), model=body.get("model"), max_tokens=body.get("max_tokens"), stop=stops)
    chat.update(chat_tool_fields(body))
    try:
        served = parse_request("chat.completions", {k: v for k, v in chat.items() if v is not None}, ctx)
    except ApiError as e:
        raise _in_messages_words(e) from None
    return dataclasses.replace(served, stream=stream, include_usage=False, top_logprobs=None)


def count_tokens(body: dict[str, Any], ctx: ParseContext) -> int:
    """The prompt's tokens for `body` as `/v1/messages` would read it (its template rendered), whatever its length."""
    _check_keys(body, COUNT_KEYS, "/v1/messages/count_tokens")
    check_model(body, ctx.model)
    messages = _messages(body)
    tools = chat_tool_fields(body)
    try:
        specs, choice = read_tool_fields(tools)
        request = GenerationRequest(messages=messages, tools=specs, tool_choice=choice)
        return len(prompt_ids_for(ctx.tokenizer, request))
    except ApiError:
        raise
    except (EngineError, TypeError, ValueError) as e:
        raise ApiError(400, str(e), param="messages") from None


def _in_messages_words(e: ApiError) -> ApiError:
    """A chat-path error said with the Messages field names."""
    param = e.param
    message = e.message.replace("stop takes", "stop_sequences takes").replace("stop must", "stop_sequences must")
    if param == "stop":
        param = "stop_sequences"
    return ApiError(e.status, message, param=param, code=e.code, type=e.type)
