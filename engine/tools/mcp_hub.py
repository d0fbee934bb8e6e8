"""Every MCP server of an mcp.json, behind blocking, thread-safe calls: `McpHub`.

The `mcp` SDK is anyio-based; the hub runs its own asyncio loop in ONE background thread (never the
caller's: the window's qasync loop and the CLI's plain thread both just call in and wait), so every method
here blocks and is meant for a worker thread, not a UI thread. Each server is an
`engine.tools.mcp_link.ServerLink` on that loop; one that fails to start, or dies, is said in words and
the others keep working.

Tool names: a server's tool is offered under its own name when no other running server has one of the
same name and the name is a valid tool name (`NAME_PATTERN`); otherwise as `<server>__<tool>`, its
characters outside `[A-Za-z0-9_-]` made `_`, cut to 64 (a number added if that still collides).
`ServerStatus.renamed` lists each renaming, `server_of` maps an offered name back. docs/tools.md "MCP".
"""

from __future__ import annotations

import asyncio
import atexit
import re
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from engine.tools.mcp_config import McpConfig
from engine.tools.mcp_results import MAX_RESULT_CHARS, McpError, ServerStatus, ToolResult
from engine.tools.spec import MAX_DESCRIPTION_CHARS, NAME_PATTERN, ToolSpec, ToolSpecError

if TYPE_CHECKING:
    from engine.tools.mcp_link import ServerLink

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_START_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0  # per server, for its process to end after the hub asks (the SDK then kills it)
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Offered:
    server: str
    name_on_server: str
    spec: ToolSpec


class McpHub:
    """The servers of one config and their tools; blocking calls from any thread but the hub's own."""

    def __init__(self, start_timeout_s: float = DEFAULT_START_TIMEOUT_S, max_result_chars: int = MAX_RESULT_CHARS) -> None:
        self.start_timeout_s = start_timeout_s
        self.max_result_chars = max_result_chars
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._links: dict[str, ServerLink] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._offered: dict[str, _Offered] = {}
        self._closed = False

    # --- the blocking interface --------------------------------------------------------------------------------

    def start(self, config: McpConfig) -> list[ServerStatus]:
        """Start (or reach) every server of `config`, list their tools; one status per server, in order.
        A hub already started is closed down first (its servers ended), then started with `config`."""
        if self._closed:
            raise McpError("this MCP hub was closed; make a new one")
        if self._links:
            self._run(self._close_all())
        return self._run(self._start_all(config))

    def tools(self) -> tuple[ToolSpec, ...]:
        """Every tool offered, under its offered name (see the module's docstring), servers in config order."""
        with self._lock:
            return tuple(o.spec for o in self._offered.values())

    def server_of(self, tool_name: str) -> str:
        """The name of the server that offers `tool_name`; McpError when none does."""
        return self._lookup(tool_name).server

    def call_tool(self, tool_name: str, arguments: dict[str, Any], timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """Run one tool and wait for it (at most `timeout_s`; `cancel_calls` ends it sooner). Every ending is a
        ToolResult whose text says what happened; McpError only for a name no server offers."""
        offered = self._lookup(tool_name)
        link = self._links.get(offered.server)
        if link is None:
            return ToolResult(f"server {offered.server!r} is not running", True, outcome="failed")
        if not isinstance(arguments, dict):
            raise McpError(f"the arguments of a call to {tool_name!r} must be an object, got {type(arguments).__name__}")
        future = asyncio.run_coroutine_threadsafe(
            link.call(offered.name_on_server, arguments, timeout_s, self.max_result_chars), self._need_loop())
        try:
            return future.result()
        except BaseException:  # Ctrl-C while waiting: the call is ended on the loop too, never left running
            future.cancel()
            raise

    def cancel_calls(self) -> None:
        """End every call under way now (Stop): each answers as outcome "cancelled"."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def cancel() -> None:
            for link in self._links.values():
                for scope in list(link.calls):
                    scope.cancel()

        loop.call_soon_threadsafe(cancel)

    def close(self) -> None:
        """End every server (stdio processes stopped and, if need be, killed) and the hub's thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._links:
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(CLOSE_TIMEOUT_S * 2)
            except Exception:  # noqa: BLE001  (closing goes on: the loop stops, the SDK's own cleanup has run)
                pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> "McpHub":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- on the hub's loop ----------------------------------------------------------------------------------------

    async def _start_all(self, config: McpConfig) -> list[ServerStatus]:
        from engine.tools.mcp_link import ServerLink  # the SDK loads here, at the first start

        links = [ServerLink(server) for server in config.servers]
        for link in links:
            self._links[link.name] = link
            self._tasks[link.name] = asyncio.create_task(link.run(), name=f"mcp server {link.name}")
        await asyncio.gather(*(self._ready(link) for link in links))
        running = [link for link in links if link.client is not None]
        offered, statuses = offer_tools(running)
        with self._lock:
            self._offered = offered
        return [statuses.get(link.name) or ServerStatus(link.name, False, link.error or "did not start",
                                                         transport=link.config.transport)
                for link in links]

    async def _ready(self, link: ServerLink) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(link.ready), self.start_timeout_s)
        except TimeoutError:
            link.error = (f"server {link.name!r} ({link.config.describe()}) did not answer within "
                          f"{self.start_timeout_s:g} s of starting")
            self._tasks[link.name].cancel()

    async def _close_all(self) -> None:
        for link in self._links.values():
            link.stop.set()
        tasks = list(self._tasks.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)
        self._links.clear()
        self._tasks.clear()
        with self._lock:
            self._offered = {}

    # --- plumbing -------------------------------------------------------------------------------------------------

    def _lookup(self, tool_name: str) -> _Offered:
        with self._lock:
            offered = self._offered.get(tool_name)
            known = ", ".join(self._offered) or "none"
        if offered is None:
            raise McpError(f"no MCP server offers a tool named {tool_name!r} (offered: {known})")
        return offered

    def _need_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=_run_loop, args=(loop,), name="mcp hub", daemon=True)
                self._thread.start()
                self._loop = loop
                atexit.register(self.close)
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise McpError("McpHub's blocking methods cannot be called from its own thread")
        return asyncio.run_coroutine_threadsafe(coro, self._need_loop()).result()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def offer_tools(links: list[ServerLink]) -> tuple[dict[str, _Offered], dict[str, ServerStatus]]:
    """The tools of the running servers under their offered names, and each server's status."""
    counts: dict[str, int] = {}
    for link in links:
        for tool in link.tools:
            counts[tool.name] = counts.get(tool.name, 0) + 1
    offered: dict[str, _Offered] = {}
    statuses: dict[str, ServerStatus] = {}
    for link in links:
        specs, errors, renamed = [], [], []
        for tool in link.tools:
            name = tool.name
            if counts[name] > 1 or not NAME_PATTERN.fullmatch(name):
                name = _distinct(f"{link.name}__{tool.name}", offered)
                renamed.append((tool.name, name))
            try:
                spec = _spec(name, tool)
            except ToolSpecError as e:
                why = str(e).replace("mcp.parameters", "inputSchema", 1)
                errors.append(f"tool {tool.name!r} of server {link.name!r} cannot be offered: {why}")
                continue
            offered[name] = _Offered(link.name, tool.name, spec)
            specs.append(spec)
        statuses[link.name] = ServerStatus(link.name, True, None, tuple(specs), tuple(errors),
                                           link.config.transport, tuple(renamed))
    return offered, statuses


def _distinct(name: str, taken: dict[str, _Offered]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    out, n = base, 2
    while out in taken:
        suffix = f"_{n}"
        out, n = base[:64 - len(suffix)] + suffix, n + 1
    return out


def _spec(name: str, tool: Any) -> ToolSpec:
    description = tool.description or tool.title or ""
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS - 1] + "…"
    return ToolSpec.from_dict({"name": name, "description": description, "parameters": tool.input_schema}, "mcp")
