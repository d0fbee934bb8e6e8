"""A parsed tool call and an answer split into text and calls: `ToolCall`, `ToolAnswer`.

Plain, JSON-friendly values (they ride on `GenerationStats` and are written with it by `to_dict`).
`arguments` is the JSON text as OpenAI's `function.arguments` carries it; `parsed_arguments()` is
the object.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    """An id in OpenAI's style (`call_` and 24 random letters and digits)."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model wrote: which tool, with which arguments (JSON text of an object), and its id."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def parsed_arguments(self) -> dict[str, Any]:
        value = json.loads(self.arguments)
        return value if isinstance(value, dict) else {}

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """An answer read for calls: its text outside them (`content`) and the calls, in order."""

    content: str
    calls: tuple[ToolCall, ...] = ()


def call_from_object(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters"),
                     names: frozenset[str] | None = None) -> ToolCall | None:
    """A call from a decoded `{"name": ..., "arguments": {...}}` object, or None when it is not one.

    Arguments given as JSON text (some models write them so) are read; anything that is not an object
    of arguments, or a name outside `names` (when given), is not a call.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if names is not None and obj["name"] not in names:
        return None
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def decode_json_prefix(text: str, start: int = 0) -> tuple[Any, int] | None:
    """The JSON value beginning at `text[start:]` (after whitespace) and where it ends, or None."""
    decoder = json.JSONDecoder()
    i = start
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    try:
        return decoder.raw_decode(text, i)
    except ValueError:
        return None
    except RecursionError:  # a hostile nesting depth is not a call
        return None
