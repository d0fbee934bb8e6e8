"""A request body read as JSON within limits: size (413), UTF-8, nesting depth, NaN and huge numbers (400).

The depth is measured on the raw text before `json.loads` sees it (engine.json_depth), so a body nested
100,000 deep is refused in linear time instead of overflowing a recursive parser.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from engine.json_depth import json_depth
from engine.serve.errors import ApiError
from engine.serve.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, refused with 413 past `limit` bytes (declared or streamed)."""
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        chunks.append(chunk)
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
    return doc


async def read_json(request: Request) -> dict[str, Any]:
    return parse_json_object(await read_body(request))
