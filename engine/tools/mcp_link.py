"""One MCP server's connection, on the hub's event loop: `ServerLink` (imported only by engine.tools.mcp_hub,
which imports it when a hub starts: the `mcp` SDK loads here, never at `import engine`).

A link's whole life is one task (`run`): it starts the server (stdio: the config's command as a child
process, its stderr kept in a temporary file so a failed start can say what the server printed; HTTP: the
URL with the config's headers) through the SDK's `Client`, lists its tools, then waits until the hub
closes it. anyio's cancel scopes must be entered and left in one task, so the client's context stays in
that task; calls are other tasks on the same loop, each in a cancel scope of its own that Stop cancels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from tempfile import TemporaryFile
from typing import IO, Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from engine.tools.mcp_config import McpServerConfig
from engine.tools.mcp_results import ToolResult, bounded, result_text

LIST_PAGES = 100  # a server whose tools/list never ends cannot hang the start
STDERR_TAIL = 600  # characters of a failed server's stderr quoted in its error


class ServerLink:
    """A running (or failed) server: `tools` its listing (the SDK's Tool objects), `error` why it is not running."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.tools: list[Any] = []
        self.error: str | None = None
        self.client: Any = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.calls: set[anyio.CancelScope] = set()
        self._errlog: IO[str] | None = None
        self._http_status: int | None = None  # the last HTTP error status the server answered (the SDK drops it)

    @property
    def name(self) -> str:
        return self.config.name

    async def run(self) -> None:
        """Start, list, wait for `stop`; `ready` is set once listed (or failed), `error` says why it failed."""
        try:
            async with Client(self._transport()) as client:
                self.tools = await _list_tools(client)
                self.client = client
                self.ready.set_result(None)
                await self.stop.wait()
        except asyncio.CancelledError:
            self.error = self.error or f"server {self.name!r}: stopped before it was ready"
            raise
        except BaseException as e:  # noqa: BLE001  (anything a server does is said in words, never raised)
            self.error = self._why(e)
        finally:
            self.client = None
            if not self.ready.done():
                self.ready.set_result(None)
            if self._errlog is not None:
                self._errlog.close()

    def _transport(self) -> Any:
        c = self.config
        if c.command is not None:
            self._errlog = TemporaryFile("w+", encoding="utf-8", errors="replace")
            params = StdioServerParameters(command=c.command, args=list(c.args), env=dict(c.env) or None, cwd=c.cwd)
            return stdio_client(params, errlog=self._errlog)
        return _http_transport(str(c.url), dict(c.headers), self._saw_response)

    async def _saw_response(self, response: Any) -> None:
        if response.status_code >= 400:
            self._http_status = response.status_code

    def _why(self, e: BaseException) -> str:
        """A failure in words, naming the server and what it is (its command or URL)."""
        leaf = _leaf(e)
        started = self.ready.done()
        what = f"server {self.name!r} ({self.config.describe()})"
        if isinstance(leaf, FileNotFoundError):
            return f"{what} could not start: no such program {self.config.command!r}"
        if isinstance(leaf, PermissionError):
            return f"{what} could not start: {self.config.command!r} is not allowed to run ({leaf.strerror})"
        if isinstance(leaf, MCPError) and "closed" in str(leaf).lower():
            said = self._stderr_tail()
            when = "stopped" if started else "exited before it answered"
            return f"{what} {when}" + (f"; it printed: {said}" if said else "")
        detail = str(leaf) or type(leaf).__name__
        if self._http_status is not None:
            hint = " (do its headers carry the right token?)" if self._http_status in (401, 403) else ""
            detail = f"it answered HTTP {self._http_status}{hint}"
        return f"{what} {'failed' if started else 'could not start'}: {detail}"

    def _stderr_tail(self) -> str:
        if self._errlog is None or self._errlog.closed:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            text = self._errlog.read()
        except (OSError, ValueError):
            return ""
        text = " ".join(text.split())
        return ("…" + text[-STDERR_TAIL:]) if len(text) > STDERR_TAIL else text

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float, max_chars: int) -> ToolResult:
        """Call `tool` (its name on this server); every ending is a ToolResult, said in words."""
        start = time.monotonic()

        def done(text: str, outcome: str) -> ToolResult:
            cut, truncated = bounded(text, max_chars)
            return ToolResult(cut, outcome != "ok", truncated, time.monotonic() - start, outcome)

        client = self.client
        if client is None:
            return done(self.error or f"server {self.name!r} is not running", "failed")
        with anyio.CancelScope() as scope:
            self.calls.add(scope)
            try:
                with anyio.fail_after(timeout_s):
                    result = await client.call_tool(tool, arguments)
            except TimeoutError:
                return done(f"the tool {tool!r} of server {self.name!r} did not answer within {timeout_s:g} s "
                            "(the call was abandoned)", "timeout")
            except MCPError as e:
                if "closed" in str(e).lower():
                    said = self._stderr_tail()
                    self.client = None  # later calls are answered with `error` at once
                    self.error = (f"server {self.name!r} ({self.config.describe()}) stopped during a call to {tool!r}"
                                  + (f"; it printed: {said}" if said else "") + "; it is not running")
                    return done(self.error, "failed")
                return done(f"server {self.name!r} refused the call to {tool!r}: {e}", "failed")
            except Exception as e:  # noqa: BLE001  (a malformed answer: said, the others keep working)
                return done(f"server {self.name!r} answered the call to {tool!r} with something unreadable: "
                            f"{type(e).__name__}: {str(e)[:300]}", "failed")
            finally:
                self.calls.discard(scope)
        if scope.cancelled_caught:
            return done(f"the call to {tool!r} was stopped", "cancelled")
        text = result_text(result.content, result.structured_content)
        return done(text, "error" if result.is_error else "ok")


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str], on_response: Any) -> AsyncIterator[Any]:
    """Streamable HTTP with the config's headers (the SDK's client takes them on an HTTP client of ours, whose
    response hook keeps an error status the SDK's message leaves out)."""
    import httpx2

    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0),
                                  event_hooks={"response": [on_response]}) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def _leaf(e: BaseException) -> BaseException:
    """The first real error inside anyio's exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        inner = [x for x in e.exceptions if not isinstance(x, asyncio.CancelledError)]
        e = (inner or list(e.exceptions))[0]
    return e
