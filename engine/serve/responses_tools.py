"""Function tools on `/v1/responses`: Responses' tool fields and tool items read into the chat path's, calls written.

Read: `tools` (function tools in Responses' flat shape: `{"type": "function", "name", "description",
"parameters", "strict"}`; hosted tools such as web_search are refused in words), `tool_choice` ("none", "auto",
"required", `{"type": "function", "name": ...}`), and the input items a tool loop sends back: `function_call`
(`call_id`, `name`, `arguments`: the call the model made, as the last response gave it) and
`function_call_output` (`call_id`, `output`). They become the chat path's tools, an assistant message with
`tool_calls` and `tool` messages (engine.serve.tool_calls checks them there: every output answers a call made
just before it). Written: a call as an output item of type `function_call` (`id` "fc_" + its call id, `call_id`,
`name`, `arguments`, `status`).
"""

from __future__ import annotations

from typing import Any

from engine.request import Message
from engine.serve.errors import bad_field, refused
from engine.tools import ToolCall

_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status"}
_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}


def chat_tool_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request's `tools`, `tool_choice` and `parallel_tool_calls` for a Responses body (absent ones left
    out); the chat path checks the tools themselves (names, schemas)."""
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_field("tools", 'tools must be a list of function tools like [{"type": "function", "name": '
                                     '"get_weather", "parameters": {...}}]')
        out["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)] or None
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _choice(choice)
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    return {k: v for k, v in out.items() if v is not None}


def _tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise bad_field(where, f"{where} must be a function tool object")
    kind = t.get("type")
    if kind != "function":
        raise refused(where, f"{where} is a tool of type {repr(kind)[:40]}: this server runs function tools only "
                             "(no hosted tools such as web_search, file_search or code_interpreter)")
    extra = sorted(set(t) - _TOOL_KEYS)
    if extra:
        raise refused(where, f"{where} has {', '.join(map(repr, extra))}, which this server does not read")
    fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def _choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # none / auto / required; anything else the chat path refuses in words
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else type(choice).__name__
    raise refused("tool_choice", f"tool_choice {repr(kind)[:40]} is not supported here: give \"none\", \"auto\", "
                                 "\"required\" or {\"type\": \"function\", \"name\": ...}")


def add_tool_item(out: list[Message], item: dict[str, Any], where: str) -> None:
    """A `function_call` or `function_call_output` input item added to the messages `out` (a call joins the
    assistant message just before it, or starts one)."""
    kind = item.get("type")
    keys = _CALL_KEYS if kind == "function_call" else _OUTPUT_KEYS
    extra = sorted(set(item) - keys)
    if extra:
        raise refused(where, f"{where} ({kind}) has {', '.join(map(repr, extra))}, which this server does not read")
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_field(f"{where}.call_id", f"{where} ({kind}) needs call_id, the id of the call it is or answers")
    if kind == "function_call_output":
        out.append({"role": "tool", "tool_call_id": call_id, "content": _output(item.get("output"), where)})
        return
    call = {"id": call_id, "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _output(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise bad_field(f"{where}.output", f"{where}.output must be text (a string, or input_text parts): a tool's "
                                       "result as the model is to read it")


def call_item(call: ToolCall, status: str = "completed", arguments: str | None = None) -> dict[str, Any]:
    """A call as Responses' `function_call` output item (`arguments`: what was sent so far, while streaming)."""
    return {"id": "fc_" + call.id, "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments}


def stored_answer(text: str, calls: tuple[ToolCall, ...]) -> Message:
    """The answer as the conversation kept for `previous_response_id` holds it (its calls with it)."""
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text,
            "tool_calls": [c.to_openai() for c in calls]}
