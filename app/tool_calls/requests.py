"""A chat's tools in its next request (Qt-free): `ToolRequests`, the chat controller's hook.

Given the history the controller made (system prompt, then the answer's ancestry, earlier reasoning left out),
it turns each earlier answer that called tools into OpenAI's shape (its text outside the calls, `tool_calls`)
followed by a `tool` message per call that has a result (`tool_call_id`), and gives the request the tools on in
this chat (the loaded ones and the MCP ones) with the tool choice. A branch may set the choice for one run
(`choice_once`: "Answer instead" must be free to answer in text under "required").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine import tools

from app.state.tool_settings import ChatTools, load_chat_tools, tool_results
from app.tool_calls.calls import message_calls, text_outside_calls

if TYPE_CHECKING:
    from app.state.conversation import Conversation, Message
    from app.state.database.store import Store


class ToolRequests:
    """The tool fields of a chat's requests; `mcp_tools` gives the MCP servers' tools (empty without a hub)."""

    def __init__(self, store: "Store", mcp_tools: Callable[[], Sequence[tools.ToolSpec]] = tuple):
        self.store = store
        self.mcp_tools = mcp_tools
        self.choice_once: str | None = None  # the next run's tool choice instead of the chat's (a branch)
        self.last_history: list[dict[str, Any]] = []  # the messages of the last request made (what the model read)

    def chat_tools(self, conv: "Conversation") -> ChatTools:
        return load_chat_tools(self.store, conv.id)

    def specs(self, settings: ChatTools) -> tuple[tools.ToolSpec, ...]:
        """The tools on in the chat: its loaded ones, then the MCP tools it turned on (a name once)."""
        on = list(settings.specs())
        names = {t.name for t in on}
        on += [t for t in self.mcp_tools() if t.name in settings.mcp_enabled and t.name not in names]
        return tuple(on)

    def __call__(self, conv: "Conversation", parent: "Message", history: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None]:
        """(the history with calls and results, the request's tool fields, the record of them for the answer)."""
        choice, self.choice_once = self.choice_once, None
        if conv.mode != "chat":
            return history, {}, None  # a notebook continues text: no template, no tools
        history = self.last_history = with_tool_messages(conv, parent, history, self.store)
        settings = self.chat_tools(conv)
        specs = self.specs(settings)
        if not specs:
            return history, {}, None
        choice = choice or settings.choice
        names = [t.name for t in specs]
        if choice not in ("auto", "required", "none") and choice not in names:
            raise ValueError(f"Not sent: the tool choice names {choice!r}, which is off in the Tools panel; "
                             "turn it on or choose auto")
        return history, {"tools": specs, "tool_choice": choice}, {"names": names, "choice": choice}


def with_tool_messages(conv: "Conversation", parent: "Message", history: list[dict[str, Any]],
                       store: "Store") -> list[dict[str, Any]]:
    """`history` (whose last entries are `parent`'s ancestry, in order) with each answer's calls and results."""
    chain = conv.ancestry(parent)
    head = len(history) - len(chain)
    if head < 0:
        return history
    out = list(history[:head])
    for message, entry in zip(chain, history[head:]):
        calls = message_calls(message)
        if not calls:
            out.append(entry)
            continue
        out.append({**entry, "content": text_outside_calls(conv, message), "tool_calls": [c.to_openai() for c in calls]})
        results = tool_results(store, message.id)
        for call in calls:
            result = results.get(call.id)
            if result is not None:
                out.append({"role": "tool", "tool_call_id": call.id, "content": result.text})  # a denial says so
    return out
