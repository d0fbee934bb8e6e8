"""Reading an upstream's answer within the proxy's limits: bytes counted as they come, lines capped, JSON checked.

Nothing the upstream sends is trusted: a body or a stream past `ProxyLimits.max_answer_bytes`, a line past
`max_line_bytes`, text that is not UTF-8, JSON that is not JSON (NaN, nested past PROXY_MAX_JSON_DEPTH), a
document that is not an object, choices that are not objects, an `index` that is not a choice asked for, or
text that cannot be written back out (a lone surrogate) is a `BadUpstream`, which the proxy answers with 502
`bad_upstream` (in a stream: the usual error event, then `[DONE]`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from engine.json_depth import json_depth
from engine.serve.proxy_limits import PROXY_MAX_JSON_DEPTH


class BadUpstream(Exception):
    """The upstream's answer cannot be passed on; the message (to follow the upstream's URL) says why."""


def _short(value: Any) -> str:
    return repr(value)[:60]


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


async def read_whole(response: httpx.Response, limit: int) -> bytes:
    """The body, refused past `limit` bytes (counted as they come, so an endless body stops there)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise BadUpstream(f"sent an answer of more than {limit:,} bytes, the most this proxy takes of one answer")
        chunks.append(chunk)
        await asyncio.sleep(0)  # a read that never waits (an upstream as fast as we read) must not hold the loop
    return b"".join(chunks)


async def sse_events(response: httpx.Response, max_bytes: int, max_line: int) -> AsyncIterator[tuple[str | None, str]]:
    """(event name or None, `data:` payload) of an event stream, one per data line, as they arrive; at most
    `max_bytes` in all and `max_line` per line (httpx's own line reader would hold an endless line whole). The
    name is the `event:` line's before the data (Responses and Anthropic's streams name each event; chat's do
    not), forgotten at the blank line that ends the event."""
    pending = b""
    size = 0
    name: str | None = None
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise BadUpstream(f"streamed more than {max_bytes:,} bytes, the most this proxy takes of one answer")
        pending += chunk
        if b"\n" in chunk:
            *lines, pending = pending.split(b"\n")
            for line in lines:
                name, data = _line_of(line, name)
                if data is not None:
                    yield name, data
        if len(pending) > max_line:
            raise BadUpstream(f"streamed a line of more than {max_line:,} bytes")
        await asyncio.sleep(0)
    name, data = _line_of(pending, name)
    if data is not None:
        yield name, data


async def sse_data(response: httpx.Response, max_bytes: int, max_line: int) -> AsyncIterator[str]:
    """The `data:` payloads of an event stream (`sse_events` without the names)."""
    async for _, data in sse_events(response, max_bytes, max_line):
        yield data


def _line_of(line: bytes, name: str | None) -> tuple[str | None, str | None]:
    """(the event's name after this line, the line's data or None)."""
    line = line.rstrip(b"\r")
    if not line:
        return None, None  # the blank line that ends an event
    if line.startswith(b"event:"):
        return _text(line[6:]).strip()[:200] or None, None
    if not line.startswith(b"data:"):
        return name, None  # comments (pings), ids, retry hints
    return name, _text(line[5:]).strip()


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadUpstream(f"streamed text that is not UTF-8 (byte {e.start} of a line)") from None


# A surrogate's escape: paired ones are joined into one character by json.loads, a lone one stays, and no
# UTF-8 writer (the client's answer, the record's file) takes it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def upstream_json(raw: bytes | str) -> Any:
    """`raw` as JSON, checked before and while it is parsed."""
    depth = json_depth(raw)
    if depth > PROXY_MAX_JSON_DEPTH:
        raise BadUpstream(f"answered with JSON nested {depth} levels deep; this proxy reads at most "
                          f"{PROXY_MAX_JSON_DEPTH}")
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BadUpstream(f"answered with something that is not JSON ({e.msg} at line {e.lineno}, column "
                          f"{e.colno})") from None
    except (ValueError, RecursionError) as e:  # NaN/Infinity, a number of more than 4300 digits, not UTF-8
        raise BadUpstream(f"answered with JSON this proxy cannot read: {e}") from None
    escapes = _SURROGATE_ESCAPE.search(raw) if isinstance(raw, str) else _SURROGATE_ESCAPE_BYTES.search(raw)
    if escapes:
        passable(doc)  # a lone one anywhere (a token's text the client never sees) would lose the record
    return doc


def upstream_choices(doc: Any, n: int, *, stream: bool) -> list[tuple[int, dict[str, Any]]]:
    """The (index, choice) pairs of an answer or a chunk, each checked: an object, with an index asked for.

    A missing `index` is the choice's place (a whole answer) or 0 (a chunk: servers that stream one choice)."""
    if not isinstance(doc, dict):
        raise BadUpstream(f"answered with a JSON {_kind(doc)} where an object belongs: {_short(doc)}")
    choices = doc.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list):
        raise BadUpstream(f"answered with 'choices' that is a JSON {_kind(choices)}, not a list")
    out = []
    for place, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise BadUpstream(f"answered with a choice that is a JSON {_kind(choice)}, not an object: {_short(choice)}")
        index = choice.get("index", 0 if stream else place)
        if not isinstance(index, int) or isinstance(index, bool):
            raise BadUpstream(f"answered with a choice whose index is {_short(index)}, not a whole number")
        if not 0 <= index < n:
            raise BadUpstream(f"answered with choice index {index}; the request asked for {n} "
                              f"choice{'s' if n != 1 else ''}")
        out.append((index, choice))
    return out


def passable(doc: Any) -> bytes:
    """`doc` as the JSON the client gets (UTF-8); text that cannot be written so (a lone surrogate) is refused."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadUpstream(f"answered with text that is not Unicode (a lone surrogate at character {e.start})") from None
