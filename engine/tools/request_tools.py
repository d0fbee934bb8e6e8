"""A request's tools, end to end, for the decode loop and the server: plan, prompt, parsed calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.tools.calls import ToolAnswer
from engine.tools.formats import parse_answer
from engine.tools.render import ToolPlan, has_tool_history, tool_plan, tool_prompt_ids

if TYPE_CHECKING:
    from engine.request import GenerationRequest


def plan_for_request(tok: Any, request: "GenerationRequest") -> ToolPlan | None:
    """How `request`'s tools reach this model (None: a request without tools or tool history)."""
    if request.messages is None or not (request.tools or has_tool_history(request.messages)):
        return None
    return tool_plan(tok, request.tools, request.tool_choice_spec, request.messages)


def prompt_ids_with_tools(tok: Any, request: "GenerationRequest") -> list[int] | None:
    """The prompt ids of a chat with tools or tool history (None: render it as any chat, `chat_ids`)."""
    plan = plan_for_request(tok, request)
    if plan is None or request.messages is None:
        return None
    return tool_prompt_ids(tok, request.messages, plan)


def answer_calls(text: str, plan: ToolPlan | None) -> ToolAnswer:
    """The answer split into content and calls (none where tool_choice is "none" or there are no tools)."""
    if plan is None or not plan.tools or not plan.choice.calls:
        return ToolAnswer(text)
    return parse_answer(text, plan.format, plan.names)
