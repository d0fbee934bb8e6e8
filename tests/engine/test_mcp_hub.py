"""The MCP hub against a real MCP server (tests/mcp_server_fixture.py, the `mcp` SDK's server side), over stdio
and over streamable HTTP on 127.0.0.1, at once: tools listed, calls, errors, limits, timeout and Stop.

One hub for the module: the same server twice (its tools' names collide, so each is offered as
`<server>__<tool>`), plus an HTTP server reached without its token (refused, said in words).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from engine.tools.mcp_config import parse_mcp_config
from engine.tools.mcp_hub import McpHub
from engine.tools.mcp_results import MAX_RESULT_CHARS, McpError, shown_escaped

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mcp_server_fixture import HERE, running_http_mcp_server  # noqa: E402

pytestmark = pytest.mark.slow
TOKEN = "t0ken-for-the-test"


@pytest.fixture(scope="module")
def started():
    with running_http_mcp_server(TOKEN) as url:
        config = parse_mcp_config({"mcpServers": {
            "local": {"command": sys.executable, "args": [str(HERE), "stdio"]},
            "web": {"url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}},
            "locked": {"url": url}}})
        hub = McpHub()
        try:
            yield hub, {s.name: s for s in hub.start(config)}
        finally:
            hub.close()


def test_tools_are_listed_over_both_transports_and_colliding_names_made_distinct(started):
    hub, status = started
    assert status["local"].ok and status["web"].ok, status
    assert (status["local"].transport, status["web"].transport) == ("stdio", "http")
    names = [t.name for t in hub.tools()]
    assert "local__add" in names and "web__add" in names and "add" not in names
    assert ("get_weather", "web__get_weather") in status["web"].renamed
    assert hub.server_of("web__add") == "web" and hub.server_of("local__add") == "local"
    weather = next(t for t in hub.tools() if t.name == "local__get_weather")
    assert weather.description == "The weather in a city"
    assert weather.schema["properties"]["city"]["type"] == "string" and weather.schema["required"] == ["city"]


def test_a_tool_whose_schema_is_invalid_is_reported_and_the_others_are_offered(started):
    hub, status = started
    (problem,) = status["local"].tool_errors
    assert "tool 'bad_schema' of server 'local' cannot be offered: inputSchema.required" in problem
    assert "local__bad_schema" not in [t.name for t in hub.tools()]
    assert len(status["local"].tools) == len([t for t in hub.tools() if hub.server_of(t.name) == "local"]) > 5


def test_a_server_refusing_the_connection_is_said_with_its_http_status(started):
    hub, status = started
    locked = status["locked"]
    assert not locked.ok and not locked.tools
    assert "server 'locked'" in locked.error and "HTTP 401" in locked.error and TOKEN not in locked.error


@pytest.mark.parametrize("server", ["local", "web"])
def test_a_call_over_each_transport(started, server):
    hub, _ = started
    result = hub.call_tool(f"{server}__get_weather", {"city": "Paris"})
    assert (result.text, result.is_error, result.truncated, result.outcome) == ("18 C and sunny", False, False, "ok")
    assert 0 < result.seconds < 5
    assert hub.call_tool(f"{server}__add", {"a": 2, "b": 3.5}).text == "5.5"


def test_an_is_error_result_is_the_tools_error(started):
    hub, _ = started
    result = hub.call_tool("web__fail", {"reason": "no luck"})
    assert result.is_error and result.outcome == "error" and "fail: no luck" in result.text


def test_a_huge_result_is_cut_to_the_limit_and_says_so(started):
    hub, _ = started
    result = hub.call_tool("local__huge", {"n": 200_000})
    assert result.truncated and not result.is_error
    kept, note = result.text.rsplit("\n", 1)
    assert len(kept) == MAX_RESULT_CHARS and kept.startswith("0123456789")
    assert note == f"[truncated: the tool's result has 200,000 characters; the first {MAX_RESULT_CHARS:,} are kept]"


def test_content_that_is_not_text_is_described_not_shown(started):
    hub, _ = started
    assert hub.call_tool("local__picture", {}).text == "a red dot\n[image: image/png, about 9 bytes; not shown]"


def test_control_characters_arrive_as_sent_and_are_shown_escaped(started):
    hub, _ = started
    text = hub.call_tool("local__escape", {}).text
    assert "\x1b[31m" in text  # the model gets the tool's text as it is
    assert shown_escaped(text) == "bell\\x07 esc\\x1b[31mred\\x1b[0m nul\\x00 end"


def test_a_tool_that_hangs_times_out_and_the_server_keeps_working(started):
    hub, _ = started
    start = time.monotonic()
    result = hub.call_tool("web__slow", {"seconds": 30}, timeout_s=0.3)
    assert result.outcome == "timeout" and result.is_error and time.monotonic() - start < 3
    assert "did not answer within 0.3 s" in result.text and "'web'" in result.text
    assert hub.call_tool("web__add", {"a": 1, "b": 1}).text == "2"


def test_cancel_calls_ends_a_call_under_way(started):
    hub, _ = started
    threading.Timer(0.3, hub.cancel_calls).start()
    start = time.monotonic()
    result = hub.call_tool("local__slow", {"seconds": 30})
    assert result.outcome == "cancelled" and result.is_error and time.monotonic() - start < 3
    assert hub.call_tool("local__add", {"a": 1, "b": 2}).text == "3"


def test_a_tool_no_server_offers_is_an_error_in_words(started):
    hub, _ = started
    with pytest.raises(McpError, match="no MCP server offers a tool named 'add'"):
        hub.call_tool("add", {"a": 1, "b": 2})
