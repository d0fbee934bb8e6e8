"""Calls written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5/3, the built-in format).

Each well-formed block is a call; a block that does not hold a call object stays in the text as it was
written. A last block the answer ended in before its `</tool_call>` (the model stopped at its end of
turn) is a call when its JSON is complete.
"""

from __future__ import annotations

from engine.tools.calls import ToolAnswer, ToolCall, call_from_object, decode_json_prefix

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse(text: str, names: frozenset[str] | None = None) -> ToolAnswer:
    calls: list[ToolCall] = []
    kept: list[str] = []
    i = 0
    while (start := text.find(OPEN, i)) >= 0:
        decoded = decode_json_prefix(text, start + len(OPEN))
        call = call_from_object(decoded[0], names=names) if decoded is not None else None
        end = decoded[1] if decoded is not None else -1
        rest = text[end:].lstrip() if call is not None else ""
        if call is not None and rest.startswith(CLOSE):
            end = len(text) - len(rest) + len(CLOSE)
        elif call is None or rest:  # not a call, or something else before the closer: text as written
            kept.append(text[i:start + len(OPEN)])
            i = start + len(OPEN)
            continue
        else:
            end = len(text)  # an unclosed last block
        kept.append(text[i:start])
        calls.append(call)
        i = end
    kept.append(text[i:])
    return ToolAnswer("".join(kept).strip() if calls else text, tuple(calls))
