"""An `mcp.json` as LM Studio and Claude Desktop write it: which MCP servers to start or reach.

    {"mcpServers": {"weather": {"command": "uvx", "args": ["mcp-weather"], "env": {"KEY": "..."}},
                    "search":  {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}}}}

A server is a `command` (with `args`, `env`, `cwd`: run as a child process, spoken to over stdin/stdout)
or a `url` (with `headers`: streamable HTTP). `type` (or `transport`) may say which: "stdio", or "http" /
"streamable-http" / "streamableHttp"; SSE is refused in words. A server with `"disabled": true` is skipped;
other keys are ignored (each app adds its own). Everything is checked here, before any process starts: a
wrong file is one `McpConfigError` naming the file and the field. Commands come only from this file, never
from a model's output or a served request. docs/tools.md "MCP".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EngineError

MAX_CONFIG_BYTES = 1_000_000
STDIO_TYPES = ("stdio",)
HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


class McpConfigError(EngineError, ValueError):
    """An mcp.json that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class McpServerConfig:
    """One server of the file: a command to run (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """What starts or where it is, for messages (never the env's or headers' values: they hold secrets)."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)


@dataclass(frozen=True)
class McpConfig:
    """The servers of one file, in its order; `source` is where it was read (for messages)."""

    servers: tuple[McpServerConfig, ...]
    source: str = "mcp.json"


def read_mcp_config(path: str | Path) -> McpConfig:
    """The servers of the mcp.json at `path`; McpConfigError says what is wrong with it."""
    where = str(path)
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            raise McpConfigError(f"{where}: is a folder, not an mcp.json file")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise McpConfigError(f"{where}: {p.stat().st_size:,} bytes; an mcp.json holds at most {MAX_CONFIG_BYTES:,}")
        data = p.read_bytes()
    except FileNotFoundError:
        raise McpConfigError(f"{where}: no such file") from None
    except OSError as e:
        raise McpConfigError(f"{where}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise McpConfigError(f"{where}: not UTF-8 text (byte {e.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise McpConfigError(f"{where}: nested too deeply to read") from None
    return parse_mcp_config(obj, where)


def parse_mcp_config(obj: Any, where: str = "mcp.json") -> McpConfig:
    """The servers of an mcp.json's decoded JSON; McpConfigError names `where` and the field."""
    if not isinstance(obj, Mapping):
        raise McpConfigError(f'{where}: must be a JSON object like {{"mcpServers": {{"name": {{"command": ...}}}}}}, '
                             f"got {_kind(obj)}")
    if "mcpServers" not in obj:
        raise McpConfigError(f'{where}: has no "mcpServers" object (the servers to use, by name)')
    servers = obj["mcpServers"]
    if not isinstance(servers, Mapping):
        raise McpConfigError(f"{where}: mcpServers must be an object of servers by name, got {_kind(servers)}")
    out = []
    for name, entry in servers.items():
        server = _server(name, entry, f"{where}: mcpServers.{name}")
        if server is not None:
            out.append(server)
    if not out:
        raise McpConfigError(f"{where}: mcpServers names no server to use (it is empty, or every one is disabled)")
    return McpConfig(tuple(out), where)


def _server(name: str, entry: Any, where: str) -> McpServerConfig | None:
    if not name.strip():
        raise McpConfigError(f"{where}: a server's name must not be empty")
    if not isinstance(entry, Mapping):
        raise McpConfigError(f'{where} must be an object with a "command" or a "url", got {_kind(entry)}')
    if entry.get("disabled") is True:
        return None
    kind = entry.get("type", entry.get("transport"))
    has_command, has_url = "command" in entry, "url" in entry
    if has_command and has_url:
        raise McpConfigError(f'{where} has both "command" and "url"; a server is one or the other')
    if not has_command and not has_url:
        raise McpConfigError(f'{where} has neither "command" (a program to run) nor "url" (a streamable HTTP server)')
    if kind is not None and kind not in STDIO_TYPES + HTTP_TYPES:
        hint = " (SSE servers are not supported: use the server's streamable HTTP endpoint)" if kind == "sse" else ""
        raise McpConfigError(f"{where}.type must be \"stdio\" or \"http\", got {kind!r}{hint}")
    if kind in STDIO_TYPES and not has_command:
        raise McpConfigError(f'{where}.type is "stdio" but it has no "command"')
    if kind in HTTP_TYPES and not has_url:
        raise McpConfigError(f'{where}.type is {kind!r} but it has no "url"')
    if has_command:
        return McpServerConfig(name, command=_text(entry["command"], f"{where}.command"),
                               args=tuple(_texts(entry.get("args", []), f"{where}.args")),
                               env=_text_map(entry.get("env", {}), f"{where}.env"),
                               cwd=_text(entry["cwd"], f"{where}.cwd") if entry.get("cwd") is not None else None)
    url = _text(entry["url"], f"{where}.url")
    if not url.startswith(("http://", "https://")):
        raise McpConfigError(f"{where}.url must begin with http:// or https://, got {url!r}")
    return McpServerConfig(name, url=url, headers=_text_map(entry.get("headers", {}), f"{where}.headers"))


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise McpConfigError(f"{where} must be text, got {_kind(value)}")
    if not value.strip():
        raise McpConfigError(f"{where} must not be empty")
    if "\x00" in value:
        raise McpConfigError(f"{where} holds a NUL character")
    return value


def _texts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise McpConfigError(f"{where} must be a list of text, got {_kind(value)}")
    for i, v in enumerate(value):
        if not isinstance(v, str) or "\x00" in v:
            raise McpConfigError(f"{where}[{i}] must be text, got {_kind(v)}")
    return value


def _text_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise McpConfigError(f"{where} must be an object of text values, got {_kind(value)}")
    for k, v in value.items():
        if not isinstance(v, str) or "\x00" in v or "\x00" in k:
            raise McpConfigError(f"{where}.{k} must be text, got {_kind(v)}")
    return dict(value)


def _kind(value: Any) -> str:
    """A value's JSON kind for messages (never the value itself: it may be a secret)."""
    names = {dict: "an object", list: "a list", str: "text", bool: "true/false", int: "a number", float: "a number"}
    if value is None:
        return "null"
    return next((n for t, n in names.items() if isinstance(value, t)), type(value).__name__)
