"""The tool loop in the window (Qt-free): an answer calls an MCP tool, the user approves, the tool runs, its
result goes back, the model answers again; until it answers in text or `MAX_STEPS` answers in a row called.

Nothing runs without approval: each call waits in its block for Allow once / Always for this tool / Deny
(unless the user chose "always" for that tool in this chat earlier: app/state/tool_settings.py). The choice is
kept with the result and shown in the conversation. A denied call goes back to the model as such. Stop (the
block's, or the composer's) ends a running call (`McpHub.cancel_calls`); it comes back as "cancelled" and the
loop stops there. A call of a tool no MCP server offers (a tool from a tools.json) waits for a typed result
instead (app/controllers/tool_calls.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.state.observable import Signal
from app.state.tool_settings import ToolResult, save_tool_result, tool_results
from app.tool_calls.calls import message_calls

if TYPE_CHECKING:
    from engine import GenerationStats, tools

    from app.controllers.chat import ChatController
    from app.state.conversation import Conversation, Message
    from app.tool_calls.mcp_state import McpState
    from app.tool_calls.panel_state import ToolsPanelState

MAX_STEPS = 8  # answers with calls in a row, after the user's message, before the loop stops and says so
STEP_LIMIT_TEXT = (f"The tool loop stopped: {MAX_STEPS} answers in a row called tools (the step limit). "
                   "This call was not run; allow it to go on, or type a result.")
DENIED_RESULT = "The user denied this call; the tool did not run."


class ToolLoop:
    """Per call of an MCP tool: "approval" (waiting for the user), "running", or "limit" (not run: the step limit)."""

    def __init__(self, controller: "ChatController", mcp: "McpState", panel: "ToolsPanelState"):
        self.controller = controller
        self.mcp = mcp
        self.panel = panel
        self.state: dict[tuple[int, str], str] = {}
        self.changed = Signal()  # (Message) a call's state changed: its block shows it
        self.spawn: Callable[[Any], Any] = asyncio.ensure_future  # the window's (a failure said in its status bar)
        controller.finished.connect(self._on_finished)

    def steps(self, conv: "Conversation", message: "Message") -> int:
        """How many answers in a row, up to `message`, called tools (since the last message of the user)."""
        n = 0
        for m in reversed(conv.ancestry(message)):
            if not m.is_assistant:
                break
            if message_calls(m):
                n += 1
        return n

    def is_mcp(self, call: "tools.ToolCall") -> bool:
        return self.mcp.offers(call.name)

    def _on_finished(self, message: "Message", stats: "GenerationStats | None") -> None:
        conv = self.controller.library.current
        if conv is None or conv.messages.get(message.id) is not message or message.finish_reason != "tool_calls":
            return
        calls = [c for c in message_calls(message) if self.is_mcp(c)]
        done = tool_results(self.controller.library.store, message.id)
        settings = self.panel.tools
        for call in (c for c in calls if c.id not in done):
            if self.steps(conv, message) >= MAX_STEPS:
                self._set(message, call.id, "limit")
            elif call.name in settings.always_allowed:
                self.spawn(self.decide(message, call, "always"))
            else:
                self._set(message, call.id, "approval")

    def _set(self, message: "Message", call_id: str, state: str | None) -> None:
        key = (message.id, call_id)
        if state is None:
            self.state.pop(key, None)
        else:
            self.state[key] = state
        self.changed.emit(message)

    async def decide(self, message: "Message", call: "tools.ToolCall", decision: str) -> "Message | None":
        """The user's choice for `call`: "once" / "always" run it, "deny" tells the model it was denied; then
        the model answers on (when every call of the answer has its result)."""
        store = self.controller.library.store
        if decision == "always":
            self.panel.allow_always(call.name)
        if decision == "deny":
            save_tool_result(store, message.id, call.id, ToolResult(DENIED_RESULT, source="denied", approval="denied"))
        else:
            self._set(message, call.id, "running")
            try:
                args = json.loads(call.arguments)
                result = await self.mcp.call_tool(call.name, args if isinstance(args, dict) else {})
            finally:
                self._set(message, call.id, None)
            save_tool_result(store, message.id, call.id, ToolResult(
                result.text, source="mcp", approval=decision, is_error=result.is_error, seconds=result.seconds,
                truncated=result.truncated))
            if getattr(result, "outcome", "") == "cancelled":
                self.changed.emit(message)
                return None  # Stop: the result is kept, the loop goes no further
        self._set(message, call.id, None)
        done = tool_results(store, message.id)
        if all(c.id in done for c in message_calls(message)):
            return await self.controller.answer_after(message)
        return None

    def stop(self) -> None:
        """Stop: end a running call now (it comes back "cancelled", kept, and the model is not asked again)."""
        self.mcp.cancel_calls()
