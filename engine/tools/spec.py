"""The tools a request offers the model, and which it may call: `ToolSpec`, `ToolChoice`, checked in words.

The shape is OpenAI's function tool (`{"type": "function", "function": {"name", "description",
"parameters"}}`; the bare inner object is taken too), so a served request's `tools` and a `tools.json`
file read the same. Checked here, before any model runs: names unique and `NAME_PATTERN` (OpenAI's own
rule), parameters a JSON-schema object, at most `MAX_TOOLS` tools and `MAX_SCHEMA_CHARS` characters of
schema each (every schema becomes part of the prompt and of the constraint's grammar).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128
MAX_SCHEMA_CHARS = 16_000
MAX_DESCRIPTION_CHARS = 4_000
CHOICES = ("none", "auto", "required")


class ToolSpecError(EngineError, ValueError):
    """A tool or tool choice that cannot be used; the message names the tool and the field."""


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call.

    Attributes:
        name: what the model writes to call it (`NAME_PATTERN`).
        description: what it does, for the model.
        parameters: the JSON schema of its arguments (an object schema; `{"type": "object"}` when none given).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None

    @property
    def schema(self) -> dict[str, Any]:
        return dict(self.parameters) if self.parameters else {"type": "object"}

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's shape, as chat templates expect the `tools` variable."""
        fn: dict[str, Any] = {"name": self.name, "description": self.description, "parameters": self.schema}
        return {"type": "function", "function": fn}

    @classmethod
    def from_dict(cls, d: Any, where: str = "tool") -> "ToolSpec":
        if not isinstance(d, Mapping):
            raise ToolSpecError(f"{where} must be an object like "
                                '{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}, '
                                f"got {type(d).__name__}")
        if "function" in d:
            if d.get("type", "function") != "function":
                raise ToolSpecError(f"{where}.type must be \"function\" (the only kind of tool), got {d.get('type')!r}")
            fn = d["function"]
            where = f"{where}.function"
            if not isinstance(fn, Mapping):
                raise ToolSpecError(f"{where} must be an object with a name and parameters, got {type(fn).__name__}")
        else:
            fn = d
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ToolSpecError(f"{where}.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}")
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ToolSpecError(f"{where}.description of tool {name!r} must be text, got {type(description).__name__}")
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise ToolSpecError(f"{where}.description of tool {name!r} has {len(description):,} characters; "
                                f"at most {MAX_DESCRIPTION_CHARS:,}")
        parameters = fn.get("parameters")
        if parameters is not None:
            _check_schema(parameters, name, f"{where}.parameters")
        return cls(name, description, dict(parameters) if parameters else None)


def _check_schema(schema: Any, name: str, where: str) -> None:
    if not isinstance(schema, Mapping):
        raise ToolSpecError(f"{where} of tool {name!r} must be a JSON-schema object ({{\"type\": \"object\", ...}}), "
                            f"got {type(schema).__name__}")
    kind = schema.get("type", "object")
    if kind != "object":
        raise ToolSpecError(f"{where} of tool {name!r} must describe an object (\"type\": \"object\"): the arguments "
                            f"are named; got \"type\": {kind!r}")
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ToolSpecError(f"{where} of tool {name!r} is not plain JSON: {e}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise ToolSpecError(f"{where} of tool {name!r} has {len(text):,} characters as JSON; at most {MAX_SCHEMA_CHARS:,}")
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        raise ToolSpecError(f"{where}.properties of tool {name!r} must be an object, got {type(props).__name__}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ToolSpecError(f"{where}.required of tool {name!r} must be a list of property names, got {required!r}")


def parse_tools(tools: Any) -> tuple[ToolSpec, ...]:
    """The request's tools (OpenAI's list, or ToolSpecs already), checked; ToolSpecError says what is wrong."""
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ToolSpecError(f"tools must be a list of tools, got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise ToolSpecError(f"{len(tools)} tools given; at most {MAX_TOOLS}")
    out = tuple(t if isinstance(t, ToolSpec) else ToolSpec.from_dict(t, f"tools[{i}]") for i, t in enumerate(tools))
    seen: set[str] = set()
    for t in out:
        if t.name in seen:
            raise ToolSpecError(f"two tools are named {t.name!r}; tool names must be unique")
        seen.add(t.name)
    return out


@dataclass(frozen=True)
class ToolChoice:
    """Which calls are allowed: `mode` none / auto / required / named (then `name` is the one tool)."""

    mode: str = "auto"
    name: str = ""

    @property
    def calls(self) -> bool:
        """The model may call a tool."""
        return self.mode != "none"

    @property
    def forced(self) -> bool:
        """The answer must be a call."""
        return self.mode in ("required", "named")

    def to_openai(self) -> str | dict[str, Any]:
        return {"type": "function", "function": {"name": self.name}} if self.mode == "named" else self.mode


def parse_tool_choice(choice: Any, tools: Sequence[ToolSpec]) -> ToolChoice:
    """OpenAI's `tool_choice` ("none", "auto", "required", {"type": "function", "function": {"name": ...}},
    or a tool's name), checked against `tools`."""
    if isinstance(choice, ToolChoice):
        parsed = choice
    elif choice is None:
        parsed = ToolChoice("auto")
    elif isinstance(choice, str):
        parsed = ToolChoice(choice) if choice in CHOICES else ToolChoice("named", choice)
    elif isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        if not isinstance(name, str):
            raise ToolSpecError('tool_choice naming a tool is {"type": "function", "function": {"name": "..."}}, '
                                f"got {dict(choice)!r}")
        parsed = ToolChoice("named", name)
    else:
        raise ToolSpecError(f'tool_choice must be "none", "auto", "required" or a tool, got {type(choice).__name__}')
    if parsed.mode not in (*CHOICES, "named"):
        raise ToolSpecError(f'tool_choice mode must be one of none, auto, required, named; got {parsed.mode!r}')
    names = [t.name for t in tools]
    if parsed.mode == "named" and parsed.name not in names:
        known = ", ".join(names) if names else "no tools were given"
        raise ToolSpecError(f"tool_choice names {parsed.name!r}, which is not among the tools ({known})")
    if parsed.mode == "required" and not tools:
        raise ToolSpecError('tool_choice "required" needs at least one tool in tools')
    return parsed


ROLES = ("system", "user", "assistant", "tool")


def check_message(m: Any) -> dict[str, Any]:
    """One chat message, checked and normalised: a role and text content; an assistant message may carry
    OpenAI's `tool_calls` (content then may be null: it becomes ""), a `tool` message its `tool_call_id`."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ValueError(f"each message needs a role (system/user/assistant/tool) and text content, got {m!r}")
    out = dict(m)
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant":
            raise ValueError(f"only an assistant message carries tool_calls, got a {m['role']} message with them")
        out["tool_calls"] = [_check_history_call(c, i) for i, c in enumerate(_as_list(calls, "tool_calls"))]
        if out.get("content") is None:
            out["content"] = ""
    if m["role"] == "tool":
        if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
            raise ValueError(f"a tool message needs the tool_call_id of the call it answers, got {m!r}")
    if not isinstance(out.get("content"), str):
        raise ValueError(f"each message needs a role (system/user/assistant/tool) and text content, got {m!r}")
    return out


def _as_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _check_history_call(c: Any, i: int) -> dict[str, Any]:
    """An earlier call in the history, OpenAI's shape; arguments kept as JSON text."""
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f'tool_calls[{i}] must be {{"id": ..., "type": "function", "function": {{"name": ..., '
                         f'"arguments": "{{...}}"}}}}, got {c!r}')
    args = fn.get("arguments", "{}")
    if isinstance(args, dict):
        args = json.dumps(args, ensure_ascii=False)
    if not isinstance(args, str):
        raise ValueError(f"tool_calls[{i}].function.arguments must be JSON text, got {type(args).__name__}")
    return {"id": str(c.get("id") or ""), "type": "function", "function": {"name": fn["name"], "arguments": args}}
