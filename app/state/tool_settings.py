"""A chat's tools and the results given to its calls, kept in the store (Qt-free): `ChatTools`, `ToolResult`.

Both live in the settings table under keys of their own (`tools of chat <id>`, `tool results of message <id>`),
so no table or migration is added and a reopened database has them back; the store's recovery copies them
with the other settings. A chat's tools are the definitions the user loaded (OpenAI's function shape, checked
again by engine.tools when read: a stored list that no longer passes is dropped with its reason), which of
them are on, the MCP tools on, the tool choice, and the tools whose MCP calls run without asking.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from engine import tools as engine_tools

from app.state.database.setting_keys import chat_tools_key, tool_results_key

if TYPE_CHECKING:
    from app.state.database.store import Store

log = logging.getLogger(__name__)

CHOICES = ("auto", "required", "none")  # and a tool's name: that tool is forced
MAX_RESULT_CHARS = 16_000  # a tool result's text kept and sent back (untrusted: a longer one is cut, and says so)
CUT_NOTE = "\n[… cut: the result had {n:,} characters; at most {limit:,} are kept]"


@dataclass(frozen=True)
class ChatTools:
    """One chat's tool settings.

    Attributes:
        definitions: the loaded tools, OpenAI's shape (what tools.json held).
        source: the file they came from (shown; never read again without the user).
        enabled: names of the loaded tools that are on.
        mcp_enabled: names of MCP tools that are on for this chat.
        choice: "auto" / "required" / "none" or one tool's name.
        always_allowed: MCP tools whose calls run without asking (the user chose "Always for this tool").
    """

    definitions: tuple[dict[str, Any], ...] = ()
    source: str = ""
    enabled: frozenset[str] = frozenset()
    mcp_enabled: frozenset[str] = frozenset()
    choice: str = "auto"
    always_allowed: frozenset[str] = frozenset()

    def specs(self) -> tuple[engine_tools.ToolSpec, ...]:
        """The loaded tools that are on, as the engine's specs."""
        return tuple(t for t in engine_tools.parse_tools(list(self.definitions)) if t.name in self.enabled)

    def to_dict(self) -> dict[str, Any]:
        return {"definitions": list(self.definitions), "source": self.source, "enabled": sorted(self.enabled),
                "mcp_enabled": sorted(self.mcp_enabled), "choice": self.choice,
                "always_allowed": sorted(self.always_allowed)}

    @classmethod
    def from_dict(cls, d: Any) -> "ChatTools":
        """Read back; what does not read (a damaged or hand-edited row) is left out, said in the log."""
        if not isinstance(d, dict):
            return cls()
        definitions: tuple[dict[str, Any], ...] = ()
        raw = d.get("definitions")
        if isinstance(raw, list):
            try:
                engine_tools.parse_tools(raw)
                definitions = tuple(x for x in raw if isinstance(x, dict))
            except engine_tools.ToolSpecError as e:
                log.warning("a chat's stored tools were dropped: %s", e)
        choice = d.get("choice") if isinstance(d.get("choice"), str) else "auto"
        return cls(definitions, str(d.get("source") or ""), _names(d.get("enabled")), _names(d.get("mcp_enabled")),
                   choice or "auto", _names(d.get("always_allowed")))

    def with_(self, **changes: Any) -> "ChatTools":
        return replace(self, **changes)


def _names(value: Any) -> frozenset[str]:
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()


def load_chat_tools(store: "Store", conversation_id: int) -> ChatTools:
    return ChatTools.from_dict(store.get_setting(chat_tools_key(conversation_id)))


def save_chat_tools(store: "Store", conversation_id: int, tools: ChatTools) -> None:
    store.put_setting(chat_tools_key(conversation_id), tools.to_dict())


@dataclass(frozen=True)
class ToolResult:
    """What a call was answered with: the text (cut to `MAX_RESULT_CHARS`), where it came from, the approval.

    `source`: "typed" (the user wrote it: a sampling experiment), "mcp" (the tool ran), "denied" (the user
    refused the call; the text says so to the model). `approval`: "" for a typed result, else "once",
    "always" or "denied", shown in the conversation.
    """

    text: str
    source: str = "typed"
    approval: str = ""
    is_error: bool = False
    seconds: float = 0.0
    truncated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "source": self.source, "approval": self.approval, "is_error": self.is_error,
                "seconds": self.seconds, "truncated": self.truncated}

    @classmethod
    def from_dict(cls, d: Any) -> "ToolResult | None":
        if not isinstance(d, dict) or not isinstance(d.get("text"), str):
            return None
        seconds = d.get("seconds")
        return cls(d["text"], str(d.get("source") or "typed"), str(d.get("approval") or ""), bool(d.get("is_error")),
                   float(seconds) if isinstance(seconds, (int, float)) else 0.0, bool(d.get("truncated")))


def limited(text: str, limit: int = MAX_RESULT_CHARS) -> tuple[str, bool]:
    """`text` cut to `limit` characters with a note saying so; and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + CUT_NOTE.format(n=len(text), limit=limit), True


def tool_results(store: "Store", message_id: int) -> dict[str, ToolResult]:
    """The results given to the calls of one answer, by call id."""
    raw = store.get_setting(tool_results_key(message_id), {})
    out: dict[str, ToolResult] = {}
    if isinstance(raw, dict):
        for call_id, d in raw.items():
            result = ToolResult.from_dict(d)
            if isinstance(call_id, str) and result is not None:
                out[call_id] = result
    return out


def save_tool_result(store: "Store", message_id: int, call_id: str, result: ToolResult) -> ToolResult:
    """Keep `result` for the call (its text cut to the limit first); returns what was kept."""
    text, cut = limited(result.text)
    kept = replace(result, text=text, truncated=result.truncated or cut)
    doc = {k: r.to_dict() for k, r in tool_results(store, message_id).items()}
    doc[call_id] = kept.to_dict()
    store.put_setting(tool_results_key(message_id), doc)
    return kept
