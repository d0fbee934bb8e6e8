"""Calls written as Mistral's templates write them: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`.

The newer form (Mistral Small 3.2, Magistral: `[TOOL_CALLS]name[ARGS]{...}`, one per call) is read too. The
text before the first `[TOOL_CALLS]` is the content; a list that does not hold calls leaves the answer text.
"""

from __future__ import annotations

from engine.tools.calls import ToolAnswer, ToolCall, call_from_object, decode_json_prefix

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def parse(text: str, names: frozenset[str] | None = None) -> ToolAnswer:
    start = text.find(TOOL_CALLS)
    if start < 0:
        return ToolAnswer(text)
    content, rest = text[:start].strip(), text[start + len(TOOL_CALLS):]
    calls = _json_list(rest, names) if rest.lstrip().startswith("[") else _named(rest, names)
    return ToolAnswer(content, calls) if calls else ToolAnswer(text)


def _json_list(rest: str, names: frozenset[str] | None) -> tuple[ToolCall, ...]:
    decoded = decode_json_prefix(rest)
    if decoded is None or not isinstance(decoded[0], list) or not decoded[0] or rest[decoded[1]:].strip():
        return ()
    calls = [call_from_object(o, names=names) for o in decoded[0]]
    return () if any(c is None for c in calls) else tuple(c for c in calls if c is not None)


def _named(rest: str, names: frozenset[str] | None) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for part in rest.split(TOOL_CALLS):
        name, sep, args = part.partition(ARGS)
        decoded = decode_json_prefix(args) if sep else None
        if decoded is None or args[decoded[1]:].strip():
            return ()
        call = call_from_object({"name": name.strip(), "arguments": decoded[0]}, names=names)
        if call is None:
            return ()
        calls.append(call)
    return tuple(calls)
