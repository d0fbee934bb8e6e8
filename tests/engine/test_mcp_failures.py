"""Servers that fail: one whose command does not exist, one that exits at once (what it printed is quoted), one
that dies mid-call; each is said in words naming the server, and the others keep working. Closing the hub
ends every server process it started."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from engine.tools.mcp_config import parse_mcp_config
from engine.tools.mcp_hub import McpHub

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mcp_server_fixture import HERE  # noqa: E402

pytestmark = pytest.mark.slow
SERVER = {"command": sys.executable, "args": [str(HERE), "stdio"]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_failing_servers_are_said_and_the_others_keep_working():
    config = parse_mcp_config({"mcpServers": {
        "missing": {"command": "/nonexistent/mcp-server-xyz", "args": ["--stdio"]},
        "quits": {"command": sys.executable, "args": ["-c", "import sys; print('no config found', file=sys.stderr); sys.exit(3)"]},
        "crasher": SERVER, "steady": SERVER}})
    hub = McpHub()
    try:
        status = {s.name: s for s in hub.start(config)}
        assert not status["missing"].ok and status["missing"].error == (
            "server 'missing' (/nonexistent/mcp-server-xyz --stdio) could not start: no such program "
            "'/nonexistent/mcp-server-xyz'")
        assert not status["quits"].ok and "server 'quits'" in status["quits"].error
        assert "exited before it answered; it printed: no config found" in status["quits"].error
        assert status["crasher"].ok and status["steady"].ok
        pids = [int(hub.call_tool(f"{name}__pid", {}).text) for name in ("crasher", "steady")]

        died = hub.call_tool("crasher__crash", {})
        assert died.outcome == "failed" and died.is_error
        assert "server 'crasher'" in died.text and "stopped during a call to 'crash'" in died.text
        again = hub.call_tool("crasher__add", {"a": 1, "b": 1})
        assert again.outcome == "failed" and "it is not running" in again.text
        assert hub.call_tool("steady__add", {"a": 1, "b": 1}).text == "2"
    finally:
        hub.close()
    hub.close()  # idempotent
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_a_server_that_never_answers_times_out_at_start():
    config = parse_mcp_config({"mcpServers": {"mute": {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"]}}})
    with McpHub(start_timeout_s=0.5) as hub:
        start = time.monotonic()
        (status,) = hub.start(config)
        assert not status.ok and "server 'mute'" in status.error and "did not answer within 0.5 s" in status.error
        assert time.monotonic() - start < 8
        assert hub.tools() == ()
