"""A proxied Responses or Messages request's conversation as the record keeps it: `{"role", "content": text}`.

The engine-side record holds the chat path's messages (text parts joined); a proxied request is never read
by the chat path, so its input is turned into the same form here, loosely (the upstream checks the body):
text parts and blocks joined, a tool call as its name and arguments, a tool's result as its text, anything
else (images, documents) left out. The window and the trace read `role` and `content` of each.
"""

from __future__ import annotations

import json
from typing import Any

from engine.request import Message


def text_of(content: Any) -> str:
    """A string, or the text of a list of parts / blocks (`text`, `input_text`, `output_text`, a
    `tool_result`'s content, a `tool_use`'s call)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") == "tool_result":
            out.append(text_of(part.get("content")))
        elif part.get("type") == "tool_use":
            out.append(_call(part.get("name"), part.get("input")))
    return "".join(out)


def _call(name: Any, arguments: Any) -> str:
    shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{name}({shown})"


def responses_messages(body: dict[str, Any]) -> tuple[Message, ...]:
    """`instructions` and `input` (a string, or message / function_call / function_call_output items)."""
    out: list[Message] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
    for item in given if isinstance(given, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "function_call":
            out.append({"role": "assistant", "content": _call(item.get("name"), item.get("arguments"))})
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": text_of(item.get("output"))})
        elif isinstance(item.get("role"), str):
            out.append({"role": item["role"], "content": text_of(item.get("content"))})
    return tuple(out)


def anthropic_messages(body: dict[str, Any]) -> tuple[Message, ...]:
    """`system` (a string or text blocks) and `messages` (user and assistant turns)."""
    system = text_of(body.get("system"))
    out: list[Message] = [{"role": "system", "content": system}] if system else []
    turns = body.get("messages")
    for m in turns if isinstance(turns, list) else []:
        if isinstance(m, dict) and isinstance(m.get("role"), str):
            out.append({"role": m["role"], "content": text_of(m.get("content"))})
    return tuple(out)
