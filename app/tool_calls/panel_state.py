"""What the Tools panel shows and changes, Qt-free: the open chat's tools (`ChatTools`), loaded from a tools.json,
each on or off, the tool choice; kept with the conversation (app/state/tool_settings.py).

A tools.json is OpenAI's tools list (or an object with a "tools" list), checked by engine.tools.parse_tools:
anything wrong is one line naming the field, and the chat's tools stay as they were.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import tools

from app.state.observable import Signal
from app.state.tool_settings import ChatTools, load_chat_tools, save_chat_tools

if TYPE_CHECKING:
    from app.state.conversation import Conversation
    from app.state.conversation_list import Library

MAX_FILE_BYTES = 1_000_000  # a tools file is a few KB; a bigger one is not read


def read_tools_file(path: str | Path) -> tuple[dict[str, Any], ...]:
    """The tool definitions in `path`, checked; ValueError says in one line what is wrong (the file, the field)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{p.name}: {p.stat().st_size:,} bytes; a tools file is at most {MAX_FILE_BYTES:,}")
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{p.name}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{p.name}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p.name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if isinstance(doc, dict) and "tools" in doc:
        doc = doc["tools"]
    try:
        specs = tools.parse_tools(doc)
    except tools.ToolSpecError as e:
        raise ValueError(f"{p.name}: {e}") from None
    if not specs:
        raise ValueError(f"{p.name}: no tools in it (a list like [{{\"type\": \"function\", \"function\": {{...}}}}])")
    return tuple(t.to_openai() for t in specs)


class ToolsPanelState:
    """The open chat's tool settings; `changed` () after any change, and when another chat is opened."""

    def __init__(self, library: "Library"):
        self.library = library
        self.changed = Signal()
        self.error = ""  # the last tools file that could not be loaded, in one line ("" when none)
        library.current_changed.connect(self._on_current_changed)

    def _conv(self) -> "Conversation":
        return self.library.current or self.library.new()

    @property
    def tools(self) -> ChatTools:
        conv = self.library.current
        return load_chat_tools(self.library.store, conv.id) if conv is not None else ChatTools()

    def _save(self, settings: ChatTools) -> None:
        save_chat_tools(self.library.store, self._conv().id, settings)
        self.changed.emit()

    def _on_current_changed(self, _conv: object = None) -> None:
        self.error = ""
        self.changed.emit()

    def load_file(self, path: str | Path) -> bool:
        """Load the tools in `path` for this chat, all on; False (and `error` says why) when the file is wrong."""
        try:
            definitions = read_tools_file(path)
        except ValueError as e:
            self.error = str(e)
            self.changed.emit()
            return False
        self.error = ""
        names = frozenset(d["function"]["name"] for d in definitions)
        old = self.tools
        choice = old.choice if old.choice in ("auto", "required", "none") or old.choice in names else "auto"
        self._save(old.with_(definitions=definitions, source=str(path), enabled=names, choice=choice))
        return True

    def set_enabled(self, name: str, on: bool) -> None:
        old = self.tools
        enabled = old.enabled | {name} if on else old.enabled - {name}
        self._save(old.with_(enabled=frozenset(enabled)))

    def set_mcp_enabled(self, name: str, on: bool) -> None:
        old = self.tools
        enabled = old.mcp_enabled | {name} if on else old.mcp_enabled - {name}
        self._save(old.with_(mcp_enabled=frozenset(enabled)))

    def set_choice(self, choice: str) -> None:
        if choice != self.tools.choice:
            self._save(self.tools.with_(choice=choice))

    def allow_always(self, name: str) -> None:
        self._save(self.tools.with_(always_allowed=self.tools.always_allowed | {name}))
