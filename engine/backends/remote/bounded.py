"""A server's bytes, read within limits: no answer of the OpenAI API is larger than these, and a hostile or broken
server must not make us buffer more (an endless /v1/models body reached 3.1 GB within its 20 s timeout)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx

MAX_RESPONSE_BYTES = 64 * 2**20  # a whole answer (a model list, a completion with every prompt position's top N)
MAX_EVENT_BYTES = 16 * 2**20  # one streamed line (one token's event, with its alternatives)
MAX_ERROR_BYTES = 2**20  # an error answer's body: enough for its message, which is cut to a line anyway
_ENCODING_HEADERS = ("content-encoding", "content-length", "transfer-encoding")
_NEWLINES = re.compile(r"\r\n|\r|\n")


class LineTooLong(Exception):
    """A streamed line ran past MAX_EVENT_BYTES without a line break."""


def bounded_lines(response: httpx.Response, limit: int) -> Iterator[str]:
    """The body's lines (any of \\r\\n, \\n, \\r ends one), each at most `limit` characters: LineTooLong past that.

    A line's pieces are kept in a list until its end arrives, so a line sent a byte at a time costs linear time.
    """
    parts: list[str] = []
    size = 0
    for text in response.iter_text():
        pieces = _NEWLINES.split(text)
        if len(pieces) > 1:
            parts.append(pieces[0])
            yield "".join(parts)
            yield from pieces[1:-1]
            parts, size = [], 0
        parts.append(pieces[-1])
        size += len(pieces[-1])
        if size > limit:
            raise LineTooLong
    if size:
        yield "".join(parts)


def read_at_most(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """(the body's first `limit` bytes at most, whether that is all of it); reading stops there."""
    pieces: list[bytes] = []
    size = 0
    for piece in response.iter_bytes():
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            return b"".join(pieces)[:limit], False
    return b"".join(pieces), True


def detached(response: httpx.Response, body: bytes) -> httpx.Response:
    """A finished response holding `body` (already decoded), for what reads it after its stream closed."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _ENCODING_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=body, request=response.request)
