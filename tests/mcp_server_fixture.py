"""A real MCP server for the tests, written with the `mcp` SDK's server side (`MCPServer`, v1's FastMCP).

    python tests/mcp_server_fixture.py stdio            # over stdin/stdout (what an mcp.json `command` starts)
    python tests/mcp_server_fixture.py http PORT        # streamable HTTP on 127.0.0.1:PORT/mcp
    python tests/mcp_server_fixture.py http PORT TOKEN  # ... answering only requests with `Authorization: Bearer TOKEN`

Its tools: `add`, `get_weather` (a fixed table), `slow` (sleeps), `fail` (an isError result), `huge` (a result
of N characters), `picture` (image content), `crash` (the process exits mid-call), `pid`, `escape` (control characters)
and `bad_schema` (an input schema the engine refuses: not an object).
`running_http_mcp_server` starts the HTTP one for a test, killed with the run (`dies_with_this_process`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve()
WEATHER = {"Paris": "18 C and sunny", "London": "12 C and rain", "Tokyo": "22 C and cloudy"}


def build_server():  # -> MCPServer (imported here: the tests import this module without starting a server)
    import anyio
    import mcp_types
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("logitlab-fixture", log_level="WARNING")

    @server.tool(description="Add two numbers")
    def add(a: float, b: float) -> str:
        return f"{a + b:g}"

    @server.tool(description="The weather in a city")
    def get_weather(city: str) -> str:
        return WEATHER.get(city, f"no weather known for {city}")

    @server.tool(description="Sleep for some seconds, then answer")
    async def slow(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"slept {seconds:g} s"

    @server.tool(description="Always fails")
    def fail(reason: str = "it always does") -> str:
        raise ToolError(f"fail: {reason}")

    @server.tool(description="A result of n characters")
    def huge(n: int) -> str:
        return ("0123456789" * (n // 10 + 1))[:n]

    @server.tool(description="A small picture and a caption")
    def picture() -> list[object]:
        return [mcp_types.TextContent(type="text", text="a red dot"),
                mcp_types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")]

    @server.tool(description="Exits mid-call")
    async def crash() -> str:
        await anyio.sleep(0.2)
        os._exit(3)

    @server.tool(description="This server's process id")
    def pid() -> str:
        return str(os.getpid())

    @server.tool(description="Text with control characters")
    def escape() -> str:
        return "bell\x07 esc\x1b[31mred\x1b[0m nul\x00 end"

    @server.tool(description="Its schema is not an object")
    def bad_schema(x: int) -> str:
        return str(x)

    # The SDK builds schemas from the signature, always objects; one a server might send that the engine refuses.
    server._tool_manager.get_tool("bad_schema").parameters = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": "x"}
    return server


@contextmanager
def running_http_mcp_server(token: str | None = None) -> Iterator[str]:
    """Start this server over streamable HTTP on a free 127.0.0.1 port; yield its URL; kill it after."""
    import httpx

    sys.path.insert(0, str(HERE.parent))
    from remote_server import dies_with_this_process, free_port

    port = free_port()
    argv = [sys.executable, str(HERE), "http", str(port)] + ([token] if token else [])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=dies_with_this_process)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the MCP fixture server exited with {proc.returncode}: "
                                   f"{proc.stderr.read().decode()[-2000:]}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break  # it answers (404 at /): listening
            except httpx.HTTPError:
                time.sleep(0.1)
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP fixture server did not listen within 60 s")
        yield url
    finally:
        proc.kill()
        proc.wait(10)


def _serve_http(port: int, token: str | None) -> None:
    import anyio
    import uvicorn

    app = build_server().streamable_http_app(host="127.0.0.1")
    if token:
        inner = app

        async def app(scope, receive, send):  # type: ignore[no-redef]  (a bearer check around the SDK's app)
            if scope["type"] == "http" and (b"authorization", f"Bearer {token}".encode()) not in scope["headers"]:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            await inner(scope, receive, send)

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    anyio.run(uvicorn.Server(config).serve)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        build_server().run("stdio")
    else:
        _serve_http(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
