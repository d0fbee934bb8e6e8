"""What a tool call's block does (Qt-free): its result typed by hand and the chat going on, and its branches.

- `continue_with_result`: the user types what the tool "said" (a sampling experiment), it is kept with the call
  (app/state/tool_settings.py: cut to its limit) and the model answers on: the next request carries it as a
  `tool` message with the call's `tool_call_id` (app/tool_calls/requests.py).
- `answer_instead`, `call_other_tool`, `other_value`: branches from the decision, name or value token, through
  the chat controller's branch as any alternative token is (a new sibling answer, the chat's KV cache reused).
  A branch inside the call decodes the call's beginning again as forced tokens (`branch_decoded`): the tools'
  constraint must read it. "Answer instead" runs once under tool choice "auto" (under "required" the
  constraint would refuse text), "Call another tool" under "required" when the chat forces one named tool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine import CallConfidence

from app.state.tool_settings import ToolResult, save_tool_result
from app.tool_calls.branch_points import name_text_from_decision, text_alternatives

if TYPE_CHECKING:
    from app.controllers.chat import ChatController
    from app.controllers.tool_loop import ToolLoop
    from app.state.conversation import Message
    from app.state.database.store import Store
    from app.tool_calls.requests import ToolRequests


class ToolCallActions:
    def __init__(self, controller: "ChatController", requests: "ToolRequests", store: "Store"):
        self.controller = controller
        self.requests = requests
        self.store = store
        self.loop: ToolLoop | None = None  # MCP calls' approval and the loop (app/controllers/tool_loop.py)
        self.spawn: Callable[[Any], asyncio.Task[Any]] = asyncio.ensure_future  # the window's: errors said in its status bar

    async def continue_with_result(self, message: "Message", call_id: str, text: str) -> "Message":
        """Keep `text` as the result of the call `call_id` of `message`, and answer on after it."""
        save_tool_result(self.store, message.id, call_id, ToolResult(text, source="typed"))
        conv = self.controller.library.current
        if conv is not None and conv.messages.get(message.id) is message:
            conv.message_changed.emit(message)  # its call block shows the result
        return await self.controller.answer_after(message)

    async def answer_instead(self, message: "Message", conf: CallConfidence, token_id: int | None = None) -> "Message":
        """Branch at the decision token with a text token (`token_id`, default the model's likeliest one)."""
        if conf.decision is None:
            raise ValueError("this call's records do not show where it was decided")
        tokens = self.controller.library.current.tokens(message) if self.controller.library.current else []
        if token_id is None:
            alts = text_alternatives(conf, tokens)
            if not alts:
                raise ValueError("the model listed no text token at the decision point")
            token_id = alts[0].token_id
        self.requests.choice_once = "auto"
        try:
            return await self.controller.branch(message, conf.decision.token.index, token_id)
        finally:
            self.requests.choice_once = None

    async def call_other_tool(self, message: "Message", conf: CallConfidence, name: str) -> "Message":
        """Branch at the name's decision token, forcing the characters of tool `name` from there on."""
        conv = self.controller.library.current
        if conf.name is None or conv is None:
            raise ValueError("this call's records do not show where the tool was chosen")
        text = name_text_from_decision(conf, conv.tokens(message), name)
        if text is None:
            raise ValueError(f"the call cannot become a call of {name!r} at its name token")
        engine = await self.controller.host.wait_engine()
        ids = await self.controller.host.off_ui_thread(engine.tokenizer.encode, text, False)
        choice = self.requests.chat_tools(conv).choice
        self.requests.choice_once = "required" if choice not in ("auto", "required", "none") else None
        try:
            return await self.controller.branch_decoded(message, conf.name.token.index, tuple(ids))
        finally:
            self.requests.choice_once = None

    async def other_value(self, message: "Message", index: int, token_id: int) -> "Message":
        """Branch at an argument's value token `index` with the model's alternative `token_id` there."""
        return await self.controller.branch_decoded(message, index, (token_id,))
