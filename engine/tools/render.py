"""The prompt of a request with tools: the model's own template where it renders them, else the built-in block.

A template renders tools when its prompt with the `tools` variable differs from its prompt without
(`engine.tools.formats.format_of_rendered` says which format it asks for). The tokenizer renders them
through `ToolTemplate.tool_chat_text` (a tokenizer without it: the built-in format). Where the template
renders none (SmolLM2's) the built-in format does, with messages only, so any template renders it:

- a system block listing the tools as compact JSON, one a line, and asking for
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (first in the first system message, or a system
  message of its own);
- an assistant message's earlier `tool_calls` as those blocks after its text;
- `tool` messages as a user message of `<tool_response id="...">` blocks (consecutive ones together), as
  Hermes' template renders them.

`tool_choice` "none" renders no tool definitions (the model is not to call); the history's calls and
results still render. See docs/tools.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from engine.tools.formats import format_of_rendered
from engine.tools.spec import ToolChoice, ToolSpec


@runtime_checkable
class ToolTemplate(Protocol):
    """A tokenizer that renders the model's template with the `tools` variable (transformers' `tools=`)."""

    def tool_chat_text(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       add_generation_prompt: bool = True) -> str: ...


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools reach the model and come back: the format, and whether its template renders them."""

    tools: tuple[ToolSpec, ...]
    choice: ToolChoice
    format: str
    via_template: bool

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)


def has_tool_history(messages: Sequence[dict[str, Any]] | None) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages or ())


def tool_plan(tok: Any, tools: Sequence[ToolSpec], choice: ToolChoice,
              messages: Sequence[dict[str, Any]] = ()) -> ToolPlan:
    """The format for `tools` with this tokenizer's template (rendered twice, with and without them)."""
    tools = tuple(tools)
    if tools and isinstance(tok, ToolTemplate):
        probe = template_messages(messages) or [{"role": "user", "content": "Hi"}]
        try:
            with_tools = tok.tool_chat_text(probe, [t.to_openai() for t in tools])
            without = tok.tool_chat_text(probe, None)
        except Exception:  # noqa: BLE001  (a template that fails with tools, a tokenizer without one: built-in)
            return ToolPlan(tools, choice, "builtin", False)
        fmt = format_of_rendered(with_tools, without)
        if fmt != "builtin":
            return ToolPlan(tools, choice, fmt, True)
    return ToolPlan(tools, choice, "builtin", False)


def tool_prompt_text(tok: Any, messages: Sequence[dict[str, Any]], plan: ToolPlan) -> str:
    """The prompt text for `messages` with `plan`'s tools (the generation prompt added)."""
    offered = plan.tools if plan.choice.calls else ()
    if plan.via_template and isinstance(tok, ToolTemplate):
        return tok.tool_chat_text(template_messages(messages), [t.to_openai() for t in offered] or None)
    return tok.chat_text(builtin_messages(messages, offered, plan.choice))


def tool_prompt_ids(tok: Any, messages: Sequence[dict[str, Any]], plan: ToolPlan) -> list[int]:
    # The template text already carries BOS where the model wants one (as `chat_ids`).
    return list(tok.encode(tool_prompt_text(tok, messages, plan), add_special_tokens=False))


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: a call's arguments as an object (transformers' convention)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _object(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def _object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


# --- the built-in format ------------------------------------------------------------------

def builtin_block(tools: Sequence[ToolSpec], choice: ToolChoice) -> str:
    """The system text that offers `tools` in the built-in format.

    Kept short, since every decode step attends over it (docs/tools.md, "Measured"): each tool one line of
    compact JSON (`_definition`); the call's shape written as the grammar forces it.
    """
    listed = "\n".join(_definition(t) for t in tools)
    if choice.mode == "named":
        rule = f'You must call the tool "{choice.name}" now.'
    elif choice.mode == "required":
        rule = "You must call one of the tools now."
    else:
        rule = "If no tool fits, answer in plain text."
    return ("You can call these tools:\n"
            f"{listed}\n"
            'To call one, answer with only <tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}'
            "</tool_call>, the arguments matching its parameters.\n"
            f"{rule} Its result comes back in a <tool_response> block.")


def _definition(tool: ToolSpec) -> str:
    """One tool as one line of compact JSON: its name, description (where it has one) and parameters' schema.

    The schema as given, less its top-level `"type": "object"`: every tool's parameters are an object
    (engine.tools.spec refuses any other), so it says nothing, and it is 12 of a short tool's tokens.
    """
    d: dict[str, Any] = {"name": tool.name}
    if tool.description:
        d["description"] = tool.description
    d["parameters"] = {k: v for k, v in tool.schema.items() if not (k == "type" and v == "object")}
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def builtin_call(name: str, arguments: str) -> str:
    args = _object(arguments)
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "</tool_call>"


def builtin_messages(messages: Sequence[dict[str, Any]], tools: Sequence[ToolSpec],
                     choice: ToolChoice) -> list[dict[str, str]]:
    """`messages` in roles every template renders (system/user/assistant, text only), tools offered first."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            block = f'<tool_response id="{m.get("tool_call_id", "")}">\n{content}\n</tool_response>'
            if out and out[-1].get("tool_results") == "1":
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": "1"})
            continue
        if m.get("tool_calls"):
            calls = "\n".join(builtin_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        out.append({"role": role, "content": content})
    for m in out:
        m.pop("tool_results", None)
    if tools:
        block = builtin_block(tools, choice)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
