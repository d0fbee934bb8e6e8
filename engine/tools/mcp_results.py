"""What the MCP hub answers, as plain values the window and the CLI import without the `mcp` SDK:
`ServerStatus`, `ToolResult`, and a tool result made into bounded text (`result_text`), shown escaped.

A tool's result is untrusted text: it goes back to the model, never runs, and is cut to `MAX_RESULT_CHARS`
(the cut said in words inside the text, so the model and the user both see it). Content that is not text
(images, audio, resource links, binary resources) is described in one bracketed line each, never fetched
or opened. docs/tools.md "MCP".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from engine.tools.spec import ToolSpec

MAX_RESULT_CHARS = 16_000  # about 4,000 tokens: a result must leave room for the answer in a small model's context
OUTCOMES = ("ok", "error", "timeout", "cancelled", "failed")


class McpError(EngineError):
    """The hub cannot do what was asked (no such tool, not started, closed); the message says which."""


@dataclass(frozen=True)
class ServerStatus:
    """One configured server after `McpHub.start`: running (`ok`) with its tools, or why not (`error`).

    `tool_errors`: the tools it lists that cannot be offered (an invalid schema), one line each; its other
    tools work. `renamed`: (server's name, name offered) for tools renamed because another server has one
    of the same name.
    """

    name: str
    ok: bool
    error: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_errors: tuple[str, ...] = ()
    transport: str = "stdio"
    renamed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ToolResult:
    """What a call came back with: `text` for the model (bounded), and how it ended.

    `outcome`: "ok"; "error" (the tool said it failed: MCP's isError); "timeout" (no answer within the
    call's limit); "cancelled" (Stop); "failed" (the server is not running, died mid-call, or refused the
    request). `is_error` is every outcome but "ok". `truncated`: the text was cut to MAX_RESULT_CHARS.
    """

    text: str
    is_error: bool = False
    truncated: bool = False
    seconds: float = 0.0
    outcome: str = "ok"


def bounded(text: str, limit: int = MAX_RESULT_CHARS) -> tuple[str, bool]:
    """`text` cut to `limit` characters with the cut said at its end; and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n[truncated: the tool's result has {len(text):,} characters; the first {limit:,} are kept]", True


def result_text(content: Iterable[Any], structured: Any = None) -> str:
    """An MCP CallToolResult's content blocks as text: text joined by newlines, anything else described.

    Duck-typed on the blocks' `type` (the SDK's pydantic models), so this module needs no `mcp` import.
    Where a result has no content but structured content, that JSON is the text.
    """
    parts = [_block_text(b) for b in content]
    if not parts and structured is not None:
        import json

        return json.dumps(structured, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind in ("image", "audio"):
        data = getattr(block, "data", "") or ""
        return f"[{kind}: {getattr(block, 'mime_type', None) or 'unknown type'}, about {len(data) * 3 // 4:,} bytes; not shown]"
    if kind == "resource_link":
        return f"[link to a resource: {getattr(block, 'name', '')} <{getattr(block, 'uri', '')}>; not opened]"
    if kind == "resource":
        resource = getattr(block, "resource", None)
        uri = getattr(resource, "uri", "")
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return f"[resource {uri}]\n{text}"
        blob = getattr(resource, "blob", "") or ""
        return f"[resource {uri}: {getattr(resource, 'mime_type', None) or 'binary'}, about {len(blob) * 3 // 4:,} bytes; not shown]"
    return f"[content of type {kind!r}; not shown]"


def shown_escaped(text: str) -> str:
    """`text` safe for a terminal: control characters (escape sequences, bells, NULs, carriage returns) written
    as `\\x1b`-style escapes instead of acting; new lines and tabs kept."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in "\n\t":
            out.append(ch)
        elif code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif code in (0x2028, 0x2029, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x202A, 0x202B, 0x202C, 0x202D):
            out.append(f"\\u{code:04x}")  # line separators and bidirectional overrides: they change how text reads
        else:
            out.append(ch)
    return "".join(out)
