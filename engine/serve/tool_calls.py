"""Tool calling on the server: OpenAI's tool fields and tool history read (checked in words), calls written back.

Read (`read_tool_fields`, `read_tool_message`, `check_tool_results`): `tools`, `tool_choice`,
`parallel_tool_calls` (true or false: the engine makes at most one call per answer either way); an
assistant message's `tool_calls` (`id`, `type: "function"`, `function.name`, `function.arguments` as JSON
text) and `tool` messages with the `tool_call_id` of a call in the assistant message before them. Every field
is checked and sized; OpenAI's deprecated `functions`/`function_call` are refused in words.

Written: a whole answer's `message.tool_calls` (`ToolCall.to_openai()`), `content` null when the answer is
only a call (`whole_message`); a stream's `delta.tool_calls` (`ToolStream`): as OpenAI streams them, the first
delta of a call carries `index`, `id`, `type` and `function.name` (arguments ""), later ones fragments of
`function.arguments` (the model's own text of the arguments object, so the fragments join into valid JSON).
A token's log-prob goes with the chunk that carries its text; those of tokens that carry none (the opener,
the closer) go with the next chunk. docs/serve.md "Tools", docs/tools.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from engine.events import GenerationStats, TokenEvent
from engine.serve.exchange import ServedExchange
from engine.serve.errors import ApiError, bad_field, refused
from engine.tools import ToolCall, ToolChoice, ToolSpec, ToolSpecError, answer_calls, parse_tool_choice, parse_tools
from engine.tools.calls import new_call_id
from engine.tools.render import ToolPlan
from engine.tools.tracker import CallTracker
from engine.tools.spec import NAME_PATTERN

MAX_CALL_ID_CHARS = 256  # a call's id (OpenAI's are 29 characters; other servers' a little longer)
MAX_HISTORY_CALLS = 128  # calls in one assistant message of the history
MAX_ARGUMENT_CHARS = 64_000  # one earlier call's arguments (JSON text)
_ASSISTANT_KEYS = {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call", "annotations"}
_NULL_OK = ("refusal", "audio", "function_call", "annotations")  # what a client echoes back from our answer, empty
_CALL_KEYS = {"id", "type", "function", "index"}
_CONSTRAINTS = ("response_format", "grammar", "json_schema")


def read_tool_fields(body: dict[str, Any]) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
    """The request's tools and tool choice, checked; a 400 naming the field otherwise."""
    for name in ("functions", "function_call"):
        if body.get(name) is not None:
            raise refused(name, f"{name} (OpenAI's deprecated form of tool calling) is not read here; send "
                                "tools and tool_choice instead")
    value = body.get("parallel_tool_calls")
    if value is not None and not isinstance(value, bool):
        raise bad_field("parallel_tool_calls", "parallel_tool_calls must be true or false (the model makes at most "
                                               f"one call per answer either way), got {type(value).__name__}")
    try:
        tools = parse_tools(body.get("tools"))
    except ToolSpecError as e:
        raise ApiError(400, str(e), param="tools", code="invalid_value") from None
    try:
        choice = parse_tool_choice(body.get("tool_choice"), tools)
    except ToolSpecError as e:
        raise ApiError(400, str(e), param="tool_choice", code="invalid_value") from None
    if tools and choice.calls:
        given = [k for k in _CONSTRAINTS if body.get(k) is not None
                 and not (k == "response_format" and isinstance(body[k], dict) and body[k].get("type") == "text")]
        if given:
            raise bad_field(given[0], f"tools and {given[0]} cannot be combined: with tools the answer is kept to "
                                      "text or a call valid against its tool's parameters; send one of them, or "
                                      'tool_choice "none"')
    return tools, choice


def is_tool_message(m: dict[str, Any]) -> bool:
    """A message `read_tool_message` reads: a tool result, or an assistant message with more than role/content/name
    (its calls, or the empty fields a client echoes back from our answer)."""
    return m.get("role") == "tool" or m.get("role") == "assistant" and bool(set(m) - {"role", "content", "name"})


def read_tool_message(m: dict[str, Any], where: str,
                      content: Callable[[Any, str], str]) -> dict[str, Any]:
    """A `tool` message or an assistant message with `tool_calls`, checked field by field; `content` reads text."""
    if m["role"] == "tool":
        extra = sorted(set(m) - {"role", "content", "tool_call_id", "name"})
        if extra:
            raise refused(where, f"{where} (a tool result) has {', '.join(map(repr, extra))}, which this server does "
                                 "not read (role, content, tool_call_id, name)")
        call_id = m.get("tool_call_id")
        if call_id is None:
            raise bad_field(f"{where}.tool_call_id", f"{where} is a tool result without tool_call_id: in tool "
                                                     "calling, a tool message names the call it answers")
        _call_id(call_id, f"{where}.tool_call_id")
        _name(m, where)
        return {"role": "tool", "content": content(m.get("content"), where), "tool_call_id": call_id}
    extra = sorted(set(m) - _ASSISTANT_KEYS)
    if extra:
        raise refused(where, f"{where} has {', '.join(map(repr, extra))}, which this server does not support")
    for key in _NULL_OK:
        if m.get(key):
            raise refused(f"{where}.{key}", f"{where}.{key} is not read here; send it null or leave it out")
    _name(m, where)
    calls = m.get("tool_calls")
    out: dict[str, Any] = {"role": "assistant"}
    if calls is None:
        out["content"] = content(m.get("content"), where)
        return out
    if not isinstance(calls, list):
        raise bad_field(f"{where}.tool_calls", f"{where}.tool_calls must be a list of calls")
    if len(calls) > MAX_HISTORY_CALLS:
        raise bad_field(f"{where}.tool_calls", f"{where}.tool_calls has {len(calls):,} calls; at most "
                                               f"{MAX_HISTORY_CALLS}")
    out["content"] = "" if m.get("content") is None else content(m.get("content"), where)
    out["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def check_tool_results(messages: list[dict[str, Any]]) -> None:
    """Each tool message answers a call of the assistant message before it (OpenAI's rule; tool results in
    between allowed), so a result cannot be put in the model's mouth for a call it never made."""
    open_ids: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            if m["tool_call_id"] not in open_ids:
                shown = repr(m["tool_call_id"])[:60]
                raise bad_field(f"messages[{i}].tool_call_id",
                                f"messages[{i}] is a tool result for call {shown}, which no assistant message just "
                                "before it made (a tool message follows the assistant message with that call in "
                                "tool_calls)")
        else:
            open_ids = {c["id"] for c in m.get("tool_calls", ())}


def _call_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CALL_ID_CHARS:
        raise bad_field(where, f"{where} must be a call's id, a string of 1 to {MAX_CALL_ID_CHARS} characters")
    return value


def _name(m: dict[str, Any], where: str) -> None:
    name = m.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_CALL_ID_CHARS):
        raise bad_field(f"{where}.name", f"{where}.name must be a string of at most {MAX_CALL_ID_CHARS} characters")


def _history_call(c: Any, where: str) -> dict[str, Any]:
    shape = '{"id": "call_...", "type": "function", "function": {"name": "...", "arguments": "{...}"}}'
    if not isinstance(c, dict):
        raise bad_field(where, f"{where} must be a call like {shape}")
    extra = sorted(set(c) - _CALL_KEYS)
    if extra:
        raise refused(where, f"{where} has {', '.join(map(repr, extra))}; a call is {shape}")
    if c.get("type", "function") != "function":
        raise bad_field(f"{where}.type", f'{where}.type must be "function", got {str(c.get("type"))[:40]!r}')
    call_id = _call_id(c.get("id"), f"{where}.id")
    fn = c.get("function")
    if not isinstance(fn, dict) or set(fn) - {"name", "arguments"}:
        raise bad_field(f"{where}.function", f"{where}.function must be {{\"name\": ..., \"arguments\": \"{{...}}\"}}")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise bad_field(f"{where}.function.name", f"{where}.function.name must be 1 to 64 letters, digits, '_' or "
                                                  f"'-', got {str(name)[:70]!r}")
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        raise bad_field(f"{where}.function.arguments", f"{where}.function.arguments must be JSON text (a string), "
                                                       f"got {type(args).__name__}")
    if len(args) > MAX_ARGUMENT_CHARS:
        raise bad_field(f"{where}.function.arguments", f"{where}.function.arguments has {len(args):,} characters; "
                                                       f"at most {MAX_ARGUMENT_CHARS:,}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


# --- the answer ---------------------------------------------------------------------------------------------

def whole_message(text: str, stats: GenerationStats | None, plan: ToolPlan | None) -> dict[str, Any]:
    """A whole answer's `message`: its calls (as recorded, ids included) and the text outside them (null when
    there is none)."""
    calls = stats.tool_calls if stats is not None else ()
    if not calls:
        return {"role": "assistant", "content": text, "refusal": None}
    content = answer_calls(text, plan).content
    return {"role": "assistant", "content": content if content.strip() else None, "refusal": None,
            "tool_calls": [c.to_openai() for c in calls]}


class ToolStream:
    """One streamed choice's deltas when tools are offered: text as `content`, a call as `tool_calls` deltas.

    The call's structure is read by the decode loop's own reader (`engine.tools.tracker.CallTracker`) over the
    answer's text as it is sent, character by character (a token can straddle the name, the call's punctuation
    and the arguments, so a token's `tool_position` alone cannot cut them): text is held while it may still be
    the start of a call (white space, a prefix of the format's opener); then it is text (sent as content from
    there on) or a call. A call's header goes when its name's string has closed, then the arguments' own text
    as it comes, up to the arguments' end. With tools the constraint keeps an answer to text or one call, so a
    call never follows text; `finish` sends any call the final parse found that the stream did not (a model
    without the constraint).
    """

    def __init__(self, plan: ToolPlan) -> None:
        self.tracker = CallTracker(plan.format)
        self.mode = "undecided"  # undecided / text / call
        self.held = ""  # text not sent yet (undecided), or the call's text so far
        self.held_lps: list[dict[str, Any]] = []
        self.call_id = new_call_id()
        self.name: str | None = None  # sent in the header
        self.args = ""  # the arguments' text not sent yet
        self.args_sent = 0  # characters of the arguments sent
        self.args_done = False

    def feed(self, event: TokenEvent, lp: dict[str, Any] | None) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The delta and log-prob entries for one token; None while nothing can be sent (its log-prob held)."""
        if lp is not None:
            self.held_lps.append(lp)
        delta = self._delta(event.text)
        if delta is None:
            return None
        lps, self.held_lps = self.held_lps, []
        return delta, lps

    def _delta(self, text: str) -> dict[str, Any] | None:
        if self.mode == "text":
            return {"content": text} if text else None
        for i, (ch, (_, part)) in enumerate(zip(text, self.tracker.places(text))):
            if part == "text" and self.name is None and (self.held.strip() or not ch.isspace()):
                self.mode, content, self.held = "text", self.held + text[i:], ""  # it was not a call
                return {"content": content}
            if part == "text" and self.name is not None:
                continue  # after the call (the answer ends there)
            self.held += ch
            if self.tracker.state in ("json", "closer", "done"):
                self.mode = "call"  # the opener is complete
            if part == "arguments" and not self.args_done:
                self.args += ch
            elif self.args or self.args_sent:
                self.args_done = True  # the arguments' value has ended
        return self._call_delta()

    def _call_delta(self) -> dict[str, Any] | None:
        if self.name is None:
            if self.tracker.name is None:
                return None
            self.name = self.tracker.name
            header = {"index": 0, "id": self.call_id, "type": "function",
                      "function": {"name": self.name, "arguments": self._arguments()}}
            return {"tool_calls": [header]}
        fragment = self._arguments()
        return {"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]} if fragment else None

    def _arguments(self) -> str:
        """The arguments' text that came since the last fragment."""
        fragment, self.args = self.args, ""
        self.args_sent += len(fragment)
        return fragment

    def finish(self, stats: GenerationStats | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The deltas still to send at the answer's end (held text, calls the stream did not send) and the
        log-prob entries still held."""
        calls = stats.tool_calls if stats is not None else ()
        deltas: list[dict[str, Any]] = []
        streamed = self.mode == "call" and self.name is not None
        if self.mode != "text" and not streamed and self.held and not calls:
            deltas.append({"content": self.held})  # it was not a call after all (cut off, or malformed)
        if self.mode == "call" and self.name is not None and not self.args_done and calls and self.args_sent == 0:
            deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": calls[0].arguments}}]})
        for j, call in enumerate(calls[1:] if streamed else calls, start=1 if streamed else 0):
            deltas.append({"tool_calls": [{"index": j, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": call.arguments}}]})
        lps, self.held_lps = self.held_lps, []
        return deltas, lps

    def recorded(self, stats: GenerationStats) -> GenerationStats:
        """The stats as recorded: the streamed call keeps the id the client was sent."""
        if self.mode != "call" or self.name is None or not stats.tool_calls:
            return stats
        first: ToolCall = dataclasses.replace(stats.tool_calls[0], id=self.call_id)
        return dataclasses.replace(stats, tool_calls=(first, *stats.tool_calls[1:]))


def answer_parts(exchange: ServedExchange, plan: ToolPlan | None) -> tuple[str, tuple[ToolCall, ...]]:
    """The first answer's text outside its tool calls, and the calls (as recorded: the ids the client got)."""
    choice = exchange.choices[0] if exchange.choices else None
    if choice is None:
        return "", ()
    calls = choice.stats.tool_calls if choice.stats is not None else ()
    if not calls:
        return choice.text, ()
    return answer_calls(choice.text, plan).content.strip(), tuple(calls)


def tool_streams(plan: ToolPlan | None, n: int) -> list[ToolStream] | None:
    """One `ToolStream` per choice where calls are read from the answer; None where they are not."""
    if plan is None or not plan.tools or not plan.choice.calls:
        return None
    return [ToolStream(plan) for _ in range(n)]


def tools_finish_reason(stats: GenerationStats | None) -> str | None:
    """OpenAI's "tool_calls" for an answer that ended on a call (None: another reason)."""
    return "tool_calls" if stats is not None and stats.finish_reason == "tool_calls" else None


def plan_or_400(tok: Any, request: Any) -> ToolPlan | None:
    """The request's tool plan, its grammar compiled once here so a schema llguidance refuses is a 400 before
    the request waits for the model."""
    from engine.tools import plan_for_request
    from engine.tools.constraint import tool_constraint

    plan = plan_for_request(tok, request)
    if plan is not None:
        try:
            tool_constraint(plan, tok)
        except ToolSpecError as e:
            raise ApiError(400, str(e), param="tools", code="invalid_value") from None
        except RecursionError:
            raise ApiError(400, "tools: a tool's parameters are nested too deeply to compile", param="tools",
                           code="invalid_value") from None
    return plan
