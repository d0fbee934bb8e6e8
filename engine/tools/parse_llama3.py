"""Calls written as Llama 3.1-3.3 write them: the whole answer a JSON object `{"name": ..., "parameters": {...}}`.

Optionally after `<|python_tag|>`, several calls separated by `;`. An answer that is not entirely calls is
text (Llama's JSON calls have no delimiters, so a partial match is not a call).
"""

from __future__ import annotations

from engine.tools.calls import ToolAnswer, ToolCall, call_from_object, decode_json_prefix

PYTHON_TAG = "<|python_tag|>"


def parse(text: str, names: frozenset[str] | None = None) -> ToolAnswer:
    body = text.strip()
    body = body.removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return ToolAnswer(text)
    calls: list[ToolCall] = []
    i = 0
    while i < len(body):
        decoded = decode_json_prefix(body, i)
        call = call_from_object(decoded[0], names=names) if decoded is not None else None
        if decoded is None or call is None:
            return ToolAnswer(text)
        calls.append(call)
        i = decoded[1]
        while i < len(body) and body[i] in " \t\r\n;":
            i += 1
    return ToolAnswer("", tuple(calls))
