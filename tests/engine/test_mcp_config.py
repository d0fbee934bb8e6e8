"""mcp.json files (LM Studio's and Claude Desktop's format) read, and every wrong one refused in one message
naming the file and the field (engine/tools/mcp_config.py); no server starts for any of these."""

from __future__ import annotations

import json

import pytest

from engine.errors import EngineError
from engine.tools.mcp_config import McpConfigError, read_mcp_config


def _write(tmp_path, data) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def test_both_transports_are_read_with_their_fields(tmp_path):
    path = _write(tmp_path, {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-files", "/tmp"], "env": {"DEBUG": "1"}},
        "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer x"}, "type": "http"},
        "off": {"command": "never-run", "disabled": True}}})
    config = read_mcp_config(path)
    assert [s.name for s in config.servers] == ["files", "web"] and config.source == path
    files, web = config.servers
    assert (files.transport, files.command, files.args, dict(files.env)) == ("stdio", "npx", ("-y", "server-files", "/tmp"), {"DEBUG": "1"})
    assert (web.transport, web.url, dict(web.headers)) == ("http", "http://127.0.0.1:9/mcp", {"Authorization": "Bearer x"})


@pytest.mark.parametrize("data, needle", [
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    ([], "must be a JSON object"),
    ({"servers": {}}, 'has no "mcpServers"'),
    ({"mcpServers": []}, "mcpServers must be an object of servers by name, got a list"),
    ({"mcpServers": {}}, "mcpServers names no server"),
    ({"mcpServers": {"a": "npx"}}, 'mcpServers.a must be an object with a "command" or a "url", got text'),
    ({"mcpServers": {"a": {"args": ["x"]}}}, 'mcpServers.a has neither "command"'),
    ({"mcpServers": {"a": {"command": "x", "url": "http://h/mcp"}}}, 'mcpServers.a has both "command" and "url"'),
    ({"mcpServers": {"a": {"command": 3}}}, "mcpServers.a.command must be text, got a number"),
    ({"mcpServers": {"a": {"command": " "}}}, "mcpServers.a.command must not be empty"),
    ({"mcpServers": {"a": {"command": "x", "args": "-y"}}}, "mcpServers.a.args must be a list of text, got text"),
    ({"mcpServers": {"a": {"command": "x", "args": ["ok", 2]}}}, "mcpServers.a.args[1] must be text, got a number"),
    ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, "mcpServers.a.env.K must be text, got a number"),
    ({"mcpServers": {"a": {"url": "ftp://h/mcp"}}}, "mcpServers.a.url must begin with http:// or https://"),
    ({"mcpServers": {"a": {"url": "http://h/mcp", "headers": ["x"]}}}, "mcpServers.a.headers must be an object"),
    ({"mcpServers": {"a": {"url": "http://h/sse", "type": "sse"}}}, "SSE servers are not supported"),
    ({"mcpServers": {"a": {"command": "x", "type": "websocket"}}}, "mcpServers.a.type must be \"stdio\" or \"http\", got 'websocket'"),
    ({"mcpServers": {"a": {"url": "http://h/mcp", "type": "stdio"}}}, 'mcpServers.a.type is "stdio" but it has no "command"'),
])
def test_each_wrong_file_is_one_error_naming_the_file_and_the_field(tmp_path, data, needle):
    path = _write(tmp_path, data)
    with pytest.raises(McpConfigError) as e:
        read_mcp_config(path)
    assert isinstance(e.value, EngineError)
    message = str(e.value)
    assert message.startswith(path) and needle in message, message
    assert "\n" not in message


def test_a_missing_file_a_folder_and_bad_bytes_are_said(tmp_path):
    with pytest.raises(McpConfigError, match="no such file"):
        read_mcp_config(tmp_path / "absent.json")
    with pytest.raises(McpConfigError, match="is a folder"):
        read_mcp_config(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"mcpServers": {"\xff": {}}}')
    with pytest.raises(McpConfigError, match="not UTF-8"):
        read_mcp_config(bad)


def test_a_secret_value_is_never_quoted_in_an_error(tmp_path):
    path = _write(tmp_path, {"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"Authorization": ["Bearer s3cret"]}}}})
    with pytest.raises(McpConfigError) as e:
        read_mcp_config(path)
    assert "s3cret" not in str(e.value) and "headers.Authorization must be text, got a list" in str(e.value)
