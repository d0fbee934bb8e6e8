"""The window's MCP servers (Qt-free): an mcp.json loaded into one `McpHub`, the servers' state in words.

The hub's methods block (a server's start, a call): every one runs off the UI thread through
app/off_thread.run_off_thread. Servers start only when the user loads an mcp.json (their commands come from
that file only, never from a model or a request); loading another one ends the first file's servers. The
hub is closed when the window closes (and at exit by the hub itself).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine import McpConfigError, McpHub, read_mcp_config, tools

from app.controllers.off_thread import close_in_background, run_off_thread
from app.state.observable import Signal

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0  # a call that takes longer ends as a timeout (said in the panel and in the call's block)


def describe_server(status: Any) -> str:
    """One line for a server: "weather: running · 3 tools" or "weather: not running: <why>"."""
    if status.ok:
        n = len(status.tools)
        line = f"{status.name}: running · {n} tool{'s' if n != 1 else ''}"
        if status.tool_errors:
            line += f" · {len(status.tool_errors)} not offered ({status.tool_errors[0]})"
        return line
    return f"{status.name}: not running: {status.error or 'it did not start'}"


class McpState:
    """The hub and what it said; `changed` () when servers started, failed or were ended."""

    def __init__(self) -> None:
        self.hub: McpHub | None = None
        self.statuses: list[Any] = []
        self.source = ""
        self.error = ""  # an mcp.json that could not be read, in one line
        self.starting = False
        self.changed = Signal()

    def tools(self) -> tuple[tools.ToolSpec, ...]:
        """The tools the running servers offer (none before an mcp.json is loaded)."""
        hub = self.hub
        if hub is None:
            return ()
        try:
            return hub.tools()
        except Exception as e:  # noqa: BLE001 - a hub gone wrong offers nothing, and says so in the log
            log.warning("the MCP hub lists no tools: %s", e)
            return ()

    def server_name(self, tool: str) -> str:
        """The server that offers `tool` ("" when none does)."""
        try:
            return self.hub.server_of(tool) if self.hub is not None else ""
        except Exception:  # noqa: BLE001 - McpError: no server offers it (any more)
            return ""

    def offers(self, name: str) -> bool:
        return any(t.name == name for t in self.tools())

    async def load(self, path: str | Path) -> bool:
        """Read `path` and start its servers (off the UI thread); False, with `error` in one line, when the file
        is wrong. A server that fails to start is in `statuses` with its reason; the others run."""
        try:
            config = await run_off_thread(lambda _s: read_mcp_config(path))
        except McpConfigError as e:
            self.error = str(e)
            self.changed.emit()
            return False
        self.error, self.starting, self.source = "", True, str(path)
        self.changed.emit()
        hub = self.hub if self.hub is not None else McpHub()
        self.hub = hub
        try:
            self.statuses = list(await run_off_thread(lambda _s: hub.start(config)))
        except Exception as e:  # noqa: BLE001 - said in the panel, the chat goes on
            self.error = f"the MCP servers could not be started: {e}"
            self.statuses = []
        finally:
            self.starting = False
            self.changed.emit()
        return not self.error

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run tool `name` (off the UI thread; at most CALL_TIMEOUT_S); its `ToolResult` (failures said in it)."""
        hub = self.hub
        if hub is None:
            raise ValueError(f"no MCP server offers {name!r}: load an mcp.json in the Tools panel")
        return await run_off_thread(lambda _s: hub.call_tool(name, arguments, CALL_TIMEOUT_S))

    def cancel_calls(self) -> None:
        """Stop: every call under way ends now (as "cancelled"). Does not block."""
        if self.hub is not None:
            self.hub.cancel_calls()

    def close_soon(self) -> None:
        """End the servers (the window closes): on a daemon thread, so a server slow to end never holds the exit."""
        hub, self.hub = self.hub, None
        if hub is not None:
            hub.cancel_calls()
            close_in_background(hub.close, "logitlab-mcp-close")
