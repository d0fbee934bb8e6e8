"""Tool use on `/v1/messages`: Anthropic's tool fields and blocks read into the chat path's, calls written back.

Read: `tools` (client tools: `name`, `description`, `input_schema`; Anthropic's server tools such as web search
or its bash and editor tools are refused in words), `tool_choice` (`auto`, `any` -> "required", `tool` with a
`name`, `none`; `disable_parallel_tool_use` taken: the model makes at most one call per answer either way), an
assistant turn's `tool_use` blocks (`id`, `name`, `input`: the calls it made) and a user turn's `tool_result`
blocks (`tool_use_id`, `content` as text or text blocks, `is_error`). They become the chat path's tools, an
assistant message with `tool_calls` and `tool` messages (engine.serve.tool_calls checks them there: each result
answers a call of the turn just before). Written: a call as a `tool_use` block (`id`, `name`, `input` the
arguments object), the message's `stop_reason` "tool_use".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from engine.request import Message
from engine.serve.errors import bad_field, refused
from engine.tools import ToolCall

_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict"}
_USE_KEYS = {"type", "id", "name", "input", "cache_control"}
_RESULT_KEYS = {"type", "tool_use_id", "content", "is_error", "cache_control"}
TOOL_BLOCKS = ("tool_use", "tool_result")


def chat_tool_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request's `tools` and `tool_choice` for a Messages body (absent ones left out); the chat path
    checks the tools themselves (names, schemas)."""
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_field("tools", 'tools: must be a list of tools like [{"name": "get_weather", "input_schema": '
                                     '{"type": "object", ...}}]')
        if tools:
            out["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _choice(choice)
    return out


def _tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise bad_field(where, f"{where}: must be an object with a name and an input_schema")
    if t.get("type") not in (None, "custom"):
        raise refused(where, f"{where}: a tool of type {repr(t.get('type'))[:40]} is one of Anthropic's server "
                             "tools, which this server does not run; give client tools (name, input_schema)")
    extra = sorted(set(t) - _TOOL_KEYS)
    if extra:
        raise bad_field(where, f"{where}: {', '.join(map(repr, extra))}: Extra inputs are not permitted")
    if not isinstance(t.get("input_schema"), dict):
        raise bad_field(f"{where}.input_schema", f"{where}.input_schema: Field required (a JSON schema object)")
    fn = {"name": t.get("name"), "parameters": t["input_schema"]}
    if t.get("description") is not None:
        fn["description"] = t["description"]
    return {"type": "function", "function": fn}


def _choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(choice, dict):
        extra = sorted(set(choice) - {"type", "name", "disable_parallel_tool_use"})
        if extra:
            raise bad_field("tool_choice", f"tool_choice: {', '.join(map(repr, extra))}: Extra inputs are not "
                                           "permitted")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_field("tool_choice", f"tool_choice: {repr(choice)[:60]} is not a tool choice; give {{\"type\": "
                                   "\"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", \"name\": ...} or "
                                   "{\"type\": \"none\"}")


def has_tool_blocks(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in TOOL_BLOCKS for b in content)


def tool_turn(role: str, content: list[Any], where: str, text: Callable[[Any, str], str]) -> list[Message]:
    """A turn with tool blocks as chat messages: an assistant turn's text and `tool_use` blocks one assistant
    message with `tool_calls`; a user turn's `tool_result` blocks one `tool` message each, then its other blocks
    (read by `text`) as a user message."""
    uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    results = [(j, b) for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "tool_result"]
    rest = [b for b in content if not (isinstance(b, dict) and b.get("type") in TOOL_BLOCKS)]
    if role == "assistant":
        if results:
            raise bad_field(where, f"{where}: tool_result blocks go in a user turn, after the assistant's tool_use")
        calls = [_call(b, f"{where}.{content.index(b)}") for b in uses]
        return [{"role": "assistant", "content": text(rest, where) if rest else "", "tool_calls": calls}]
    if uses:
        raise bad_field(where, f"{where}: tool_use blocks are the assistant's; a user turn answers them with "
                               "tool_result blocks")
    out: list[Message] = [_result(b, f"{where}.{j}", text) for j, b in results]
    if rest:
        out.append({"role": "user", "content": text(rest, where)})
    return out


def _call(b: dict[str, Any], where: str) -> dict[str, Any]:
    # The client sends our block back as its SDK holds it: with its newer fields null (caller, toolset_name).
    extra = sorted(k for k in set(b) - _USE_KEYS if b[k] is not None)
    if extra:
        raise bad_field(where, f"{where}: {', '.join(map(repr, extra))}: Extra inputs are not permitted")
    if not isinstance(b.get("id"), str) or not b["id"]:
        raise bad_field(f"{where}.id", f"{where}.id: Field required (the tool_use block's id)")
    if not isinstance(b.get("input"), dict):
        raise bad_field(f"{where}.input", f"{where}.input: must be an object (the tool's arguments)")
    return {"id": b["id"], "type": "function",
            "function": {"name": b.get("name"), "arguments": json.dumps(b["input"], ensure_ascii=False)}}


def _result(b: dict[str, Any], where: str, text: Callable[[Any, str], str]) -> Message:
    extra = sorted(set(b) - _RESULT_KEYS)
    if extra:
        raise bad_field(where, f"{where}: {', '.join(map(repr, extra))}: Extra inputs are not permitted")
    if not isinstance(b.get("tool_use_id"), str) or not b["tool_use_id"]:
        raise bad_field(f"{where}.tool_use_id", f"{where}.tool_use_id: Field required (the id of the tool_use "
                                                "block it answers)")
    if b.get("is_error") is not None and not isinstance(b["is_error"], bool):
        raise bad_field(f"{where}.is_error", f"{where}.is_error: must be true or false")
    body = text(b.get("content", ""), f"{where}.content")
    if b.get("is_error"):
        body = f"Error: {body}"  # the model reads that the tool failed (the chat templates have no flag for it)
    return {"role": "tool", "tool_call_id": b["tool_use_id"], "content": body}


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A call as Anthropic's `tool_use` block (its input the arguments object; {} when they are not one)."""
    try:
        arguments = call.parsed_arguments()
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}
