"""The grammar that keeps an answer with tools to text or a well-formed call: `tool_constraint`.

One Lark grammar in llguidance's dialect: a rule per allowed tool, its name written out and its arguments
`%json {the tool's parameters}`, so a call's arguments always match that tool's schema. `tool_choice`
decides the top rule: "auto" allows text (any text that holds no call opener, nor begins like a call) or a call,
"required" a call to any tool, a named tool a call to it only; "none" has no grammar. The call is
written exactly as the format writes it (`engine.tools.formats`), one call per answer; the decode loop
ends the answer when the call is complete (`engine.tools.tracker`).
"""

from __future__ import annotations

import json
from typing import Any

from engine.constraints.spec import Constraint, ConstraintError
from engine.tools.render import ToolPlan
from engine.tools.spec import ToolSpec, ToolSpecError

# (before the name, between the name and the arguments, after the arguments) per format.
_SHAPES = {
    "builtin": ('<tool_call>{"name": "', '", "arguments": ', "}</tool_call>"),
    "hermes": ('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>"),
    "llama3": ('{"name": "', '", "parameters": ', "}"),
    "mistral": ('[{"name": "', '", "arguments": ', "}]"),
}
# What text may not be under "auto" (whole-text patterns): text that holds a call's opener anywhere, or (Llama 3's
# bare JSON) begins like a call. A call after some text was outside the grammar, so a small model wrote
# `<tool_call>{"name": ..., "arguments": {<arguments as JSON>}}</tool_call>` after a sentence, unparsed.
_NOT_TEXT = {
    "builtin": r"(?s:.*<tool_call>.*)",
    "hermes": r"(?s:.*<tool_call>.*)",
    "llama3": r"(?s:\s*\{.*)|(?s:.*<\|python_tag\|>.*)",
    "mistral": r"(?s:.*\[TOOL_CALLS\].*)",
}
MISTRAL_TOKEN = "[TOOL_CALLS]"


def _lark_text(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid Lark string literal (quotes, backslashes, \n escaped)


def tool_grammar(plan: ToolPlan, tok: Any = None) -> str | None:
    """The Lark grammar for `plan` (None where no call is allowed: tool_choice "none" or no tools)."""
    if not plan.choice.calls or not plan.tools:
        return None
    allowed = [t for t in plan.tools if plan.choice.mode != "named" or t.name == plan.choice.name]
    before, middle, after = _SHAPES[plan.format]
    opener = ""
    if plan.format == "mistral":
        opener = _special_token(tok, MISTRAL_TOKEN) + " "
    rules = [f"call_{i}: {opener}{_lark_text(before + t.name + middle)} args_{i} {_lark_text(after)}\n"
             f"args_{i}: %json {_args_schema(t)}" for i, t in enumerate(allowed)]
    calls = " | ".join(f"call_{i}" for i in range(len(allowed)))
    if plan.choice.mode == "auto":
        top = f"start: TEXT | {calls}\nTEXT: /(?s:.+)/ & ~/{_NOT_TEXT[plan.format]}/"
    else:
        top = f"start: {calls}"
    return top + "\n" + "\n".join(rules) + "\n"


# A call's arguments are written as the templates write them (Jinja's `tojson`, Python's json.dumps): `, `
# between items, `: ` after keys, no other whitespace. JSON's free whitespace, even bounded as llama.cpp bounds
# it (a newline and 20 spaces per slot), let SmolLM2 at temperature 0 spend ~20 tokens spacing a call's `{}` and
# run out of length inside `</tool_call>`: a broken call. Fixed separators also make every call shorter.
_CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _args_schema(tool: ToolSpec) -> str:
    schema = _closed(tool.schema)
    if isinstance(schema, dict) and "x-guidance" not in schema:  # a tool that sets its own options keeps them
        schema = {**schema, "x-guidance": _CALL_JSON}
    return json.dumps(schema, separators=(",", ":"))


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with no arguments beyond its properties where it does not say (as OpenAI's strict mode):
    JSON Schema allows any others by default, and a small model then invents some the tool does not take."""
    if "properties" in schema and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


def _special_token(tok: Any, text: str) -> str:
    """`text` as llguidance's reference to the one special token it is (`<[id]>`)."""
    ids = tok.encode(text, add_special_tokens=False) if tok is not None else []
    if len(ids) != 1:
        raise ToolSpecError(f"the model's template writes calls after {text}, but its tokenizer has no such token")
    return f"<[{int(ids[0])}]>"


def tool_constraint(plan: ToolPlan, tok: Any = None) -> Constraint | None:
    """The constraint for `plan`, checked: a tool whose parameters llguidance cannot follow is named."""
    grammar = tool_grammar(plan, tok)
    if grammar is None:
        return None
    try:
        return Constraint.lark(grammar)
    except ConstraintError as e:
        for t in plan.tools:
            _check_tool_schema(t)
        raise ToolSpecError(f"the tools cannot be made into a grammar: {e}") from None


def _check_tool_schema(tool: ToolSpec) -> None:
    try:
        Constraint.json_schema(tool.schema)
    except ConstraintError as e:
        raise ToolSpecError(f"the parameters of tool {tool.name!r} cannot be followed: {e}") from None
