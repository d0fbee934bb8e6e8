"""A request body read as JSON within limits: size (413), time (408), UTF-8, nesting depth, NaN and huge numbers and
lone surrogates (400).

The depth is measured on the raw text before `json.loads` sees it (engine.json_depth), so a body nested
100,000 deep is refused in linear time instead of overflowing a recursive parser.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from starlette.requests import Request

from engine.json_depth import json_depth
from engine.serve.errors import ApiError
from engine.serve.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, MAX_JSON_DEPTH


async def read_body(request: Request, limit: int = MAX_BODY_BYTES, timeout: float | None = BODY_TIMEOUT_S) -> bytes:
    """The raw body, refused with 413 past `limit` bytes (declared or streamed), and with 408 (the connection
    then closes) when it has not all come within `timeout` seconds of its headers (None: no limit)."""
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(size, limit)
            chunks.append(chunk)

    try:
        async with asyncio.timeout(timeout):
            await read()
    except TimeoutError:
        raise ApiError(408, f"the request body did not come within {timeout:g} s ({size:,} bytes came); send it "
                            "whole, or ask the server's owner for a longer --timeout", code="request_timeout",
                       close=True) from None
    return b"".join(chunks)


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"the request body has {size:,} bytes or more; this server takes at most {limit:,}",
                    code="request_too_large")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object, or a 400 that says what is wrong with it."""
    if not raw.strip():
        raise ApiError(400, "the request has no body: send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not UTF-8 text (byte {e.start})", code="invalid_json") from None
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ApiError(400, f"the request body nests {depth} levels deep; this server reads at most "
                            f"{MAX_JSON_DEPTH}", code="invalid_json")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not JSON: {e.msg} at line {e.lineno}, column {e.colno}",
                       code="invalid_json") from None
    except (ValueError, RecursionError) as e:  # NaN/Infinity, an integer of more than 4300 digits
        raise ApiError(400, f"the request body is not JSON this server reads: {e}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise ApiError(400, f"the request body must be a JSON object, got a JSON {type(doc).__name__}",
                       code="invalid_json")
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate(doc, "")
        if where is not None:
            raise ApiError(400, f"the request body has a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
                                f"its pair) in {where or 'a field name'}: that is not text", param=where or None,
                           code="invalid_json")
    return doc


# A \uD800-\uDFFF escape: JSON allows one alone, but it is no character (it cannot be encoded, tokenized or
# answered); looked for in the raw text first, so that ordinary bodies cost one regular-expression scan.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string (a key or a value) in `value` that is not valid Unicode text; None: none."""
    def bad(s: str) -> bool:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    if isinstance(value, str):
        return path if bad(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if bad(key):
                return path  # the name itself: shown as where it sits (the name cannot be shown as text)
            found = _lone_surrogate(item, here)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


async def read_json(request: Request, timeout: float | None = BODY_TIMEOUT_S) -> dict[str, Any]:
    return parse_json_object(await read_body(request, timeout=timeout))


def client_address(request: Request) -> str:
    """`host:port` of the client that sent `request` ("" when the server does not know it)."""
    return f"{request.client.host}:{request.client.port}" if request.client else ""
