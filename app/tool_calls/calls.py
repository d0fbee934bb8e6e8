"""An answer's tool calls as the window reads them back (Qt-free): the calls, the names it could call, the
confidence of each (engine.call_confidence over the answer's own token records), its text outside the calls.

The calls are those the engine parsed (`GenerationStats.tool_calls`, saved in the answer's stats); the allowed
names are the ones its request offered (saved in its request record under "tools"); the token records keep each
token's place in a call (app/state/database/records.py), so the numbers are the same after a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine import CallConfidence, call_confidence, tools

if TYPE_CHECKING:
    from app.state.conversation import Conversation, Message


def message_calls(message: "Message") -> tuple[tools.ToolCall, ...]:
    """The calls the answer made (none for a question, an answer in text, or a record that does not read)."""
    raw = (message.stats or {}).get("tool_calls") if message.is_assistant else None
    if not isinstance(raw, (list, tuple)):  # a tuple in memory (asdict), a list read back
        return ()
    out = []
    for c in raw:
        if isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), str):
            out.append(tools.ToolCall(c["name"], c["arguments"], str(c.get("id") or "")))
    return tuple(out)


def request_tools(message: "Message") -> dict[str, Any]:
    """What the answer's request offered: {"names": [...], "choice": "..."} ({} when it had no tools)."""
    doc = (message.request or {}).get("tools")
    return doc if isinstance(doc, dict) else {}


def allowed_names(message: "Message") -> list[str]:
    """The tool names the model could call in this answer (one under a named tool choice)."""
    doc = request_tools(message)
    names = [n for n in doc.get("names", ()) if isinstance(n, str)]
    choice = doc.get("choice")
    if isinstance(choice, str) and choice in names:
        return [choice]
    return names


def confidences(conv: "Conversation", message: "Message") -> tuple[CallConfidence, ...]:
    """Each call of the answer with what the model decided in it (an empty tuple for an answer without calls)."""
    calls = message_calls(message)
    if not calls:
        return ()
    return call_confidence(conv.tokens(message), calls, allowed_names(message) or [c.name for c in calls])


def text_outside_calls(conv: "Conversation", message: "Message") -> str:
    """The answer's text before its first call (what an OpenAI message's `content` is beside its tool_calls)."""
    tokens = conv.tokens(message)
    for i, t in enumerate(tokens):
        if t.tool_position is not None:
            return "".join(x.text for x in tokens[:i]).strip()
    if tokens and message_calls(message):  # records without positions (an older answer): the text as written
        return message.content.split("<tool_call>", 1)[0].strip()
    return message.content
