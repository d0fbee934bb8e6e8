"""The tool loop: answer, run the calls the user approves, give the results back, answer again: `run_tool_loop`.

    outcome = run_tool_loop(messages, hub.tools(), generate, approve, hub.call_tool)

`generate(messages, choice)` is one answer over the chat so far (the caller builds the request, streams and
shows it); `approve(call)` asks the user: "once", "always" (this tool, for the rest of the loop and every
later one given the same `Approvals`) or "deny"; `call_tool(name, arguments)` runs a tool (`McpHub.call`).
Nothing runs without approval. Each answer with calls adds OpenAI's shapes to the chat, as
engine/tools/spec.py `check_message` reads them and engine/tools/render.py renders them: the assistant
message with its `tool_calls`, then one `tool` message per call (`tool_call_id`): the result, the tool's
error, or that the user denied it. The loop ends when an answer has no call, after `max_steps` answers (the
last one's calls not run, said in `LoopOutcome.reason`), or when `stop()` says so. docs/tools.md "MCP".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.tools.calls import ToolCall
from engine.tools.mcp_results import ToolResult
from engine.tools.spec import ToolChoice, ToolSpec

DEFAULT_MAX_STEPS = 8
DECISIONS = ("once", "always", "deny")
DENIED = "The user denied this call; the tool did not run."


@dataclass(frozen=True)
class StepAnswer:
    """One answer as the loop needs it: its text outside the calls, the calls, and why it ended."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"


@dataclass
class Approvals:
    """The tools the user said "always" for; kept by the caller across loops (a chat's turns)."""

    always: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class CallRecord:
    """One call of the loop: what the user decided ("once", "always", "deny"; "refused" for a name no tool has),
    and its result (None when denied)."""

    step: int
    call: ToolCall
    decision: str
    result: ToolResult | None


@dataclass(frozen=True)
class LoopOutcome:
    """How the loop ended: `messages` the whole chat (the input's and every one added), `ended` "answered" /
    "step_limit" / "stopped" / "error", `reason` in words, `steps` answers made, `records` every call."""

    messages: tuple[dict[str, Any], ...]
    ended: str
    reason: str
    steps: int
    records: tuple[CallRecord, ...] = ()
    last: StepAnswer | None = None


GenerateFn = Callable[[tuple[dict[str, Any], ...], ToolChoice], StepAnswer]
ApproveFn = Callable[[ToolCall], str]
CallToolFn = Callable[[str, dict[str, Any]], ToolResult]


def run_tool_loop(messages: Sequence[dict[str, Any]], tools: Sequence[ToolSpec], generate: GenerateFn,
                  approve: ApproveFn, call_tool: CallToolFn, *, first_choice: ToolChoice | None = None,
                  max_steps: int = DEFAULT_MAX_STEPS, approvals: Approvals | None = None,
                  on_result: Callable[[CallRecord], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> LoopOutcome:
    """Run the loop (see the module's docstring). `first_choice` is the first answer's tool choice (later
    answers are "auto": the model may answer in text once it has what it asked for); `on_result` sees each
    call as it is decided and run."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    chat = [dict(m) for m in messages]
    approvals = approvals if approvals is not None else Approvals()
    records: list[CallRecord] = []
    choice = first_choice or ToolChoice("auto")
    names = {t.name for t in tools}
    for step in range(1, max_steps + 1):
        answer = generate(tuple(chat), choice)
        if answer.finish_reason == "error" or not answer.calls:
            ended = "error" if answer.finish_reason == "error" else "answered"
            reason = ("the answer failed" if ended == "error" else
                      f"the model answered in text after {step} answer{'s' if step > 1 else ''}"
                      + (" (cut at the answer's length limit)" if answer.finish_reason == "length" else ""))
            chat.append({"role": "assistant", "content": answer.content})
            return LoopOutcome(tuple(chat), ended, reason, step, tuple(records), answer)
        if step == max_steps:
            called = ", ".join(c.name for c in answer.calls)
            return LoopOutcome(tuple(chat), "step_limit",
                               f"stopped at the step limit ({max_steps} answers): the model was still calling "
                               f"tools ({called}), not run", step, tuple(records), answer)
        chat.append({"role": "assistant", "content": answer.content, "tool_calls": [c.to_openai() for c in answer.calls]})
        for call in answer.calls:
            record = _decide_and_run(step, call, names, approve, call_tool, approvals)
            records.append(record)
            chat.append({"role": "tool", "tool_call_id": call.id, "content": tool_message(record)})
            if on_result is not None:
                on_result(record)
        if stop is not None and stop():
            return LoopOutcome(tuple(chat), "stopped", f"stopped by the user after {step} answers", step,
                               tuple(records), answer)
        choice = ToolChoice("auto")
    raise AssertionError("unreachable")


def _decide_and_run(step: int, call: ToolCall, names: set[str], approve: ApproveFn, call_tool: CallToolFn,
                    approvals: Approvals) -> CallRecord:
    if call.name not in names:  # the constraint allows only offered names; a model without it may invent one
        return CallRecord(step, call, "refused", ToolResult(f"there is no tool named {call.name!r}", True, outcome="failed"))
    if call.name in approvals.always:
        decision = "always"
    else:
        decision = approve(call)
        if decision not in DECISIONS:
            raise ValueError(f"an approval is one of {', '.join(DECISIONS)}, got {decision!r}")
        if decision == "always":
            approvals.always.add(call.name)
    if decision == "deny":
        return CallRecord(step, call, decision, None)
    try:
        arguments = call.parsed_arguments()
    except ValueError:
        return CallRecord(step, call, decision, ToolResult("the call's arguments are not valid JSON", True, outcome="failed"))
    return CallRecord(step, call, decision, call_tool(call.name, arguments))


def tool_message(record: CallRecord) -> str:
    """The `tool` message's content for one call: its result, its error said as one, or the denial."""
    if record.result is None:
        return DENIED
    if record.result.is_error:
        return f"Error: {record.result.text}"
    return record.result.text


def step_from_stats(tok: Any, request: Any, stats: Any) -> StepAnswer:
    """A finished answer (`GenerationStats` of `request`, a GenerationRequest with tools) as a StepAnswer:
    the calls the decode loop parsed (their ids kept), the text outside them."""
    from engine.tools.request_tools import answer_calls, plan_for_request

    calls = tuple(stats.tool_calls)
    content = answer_calls(stats.text, plan_for_request(tok, request)).content if calls else stats.text
    return StepAnswer(content, calls, stats.finish_reason)
