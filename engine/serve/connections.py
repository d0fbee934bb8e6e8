"""What one connection may hold: its headers within a time, a place among a bounded number, and a log that a
flood of the same error cannot fill (issue 43: 1,100 connections that never finished their headers took every
file descriptor; /health and chat timed out and stderr filled with tracebacks).

uvicorn times out an idle keep-alive connection, but not one that has sent half a request line, nor one that
sends nothing; its `limit_concurrency` answers 503 only once a request's headers have come, so connections that
never finish them still hold their descriptors. `guarded_protocol` subclasses uvicorn's HTTP protocol (the one
its "auto" picks: httptools where installed, else h11; both keep `cycle`, `timeout_keep_alive_task`, `transport`
and `server_state`) with:

- a header deadline: from a connection's start, and from the first byte of each later request on it, the
  request line and headers must all come within `header_timeout_s`; else it gets a 408 and is closed;
- a connection cap: past `max_connections` open at once, a new connection gets a 503 at once and is closed
  (it is accepted first, so the listening socket never backs up and the descriptor is given back at once).

The body's own deadline is the app's (engine.serve.body.read_body: a 408 in words).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from engine.serve.limits import LOG_REPEAT_S

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseProtocol
else:
    from uvicorn.protocols.http.auto import AutoHTTPProtocol as _BaseProtocol

log = logging.getLogger(__name__)


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response with OpenAI's error JSON, written straight to a connection that has no
    request cycle (none began, or it never finished its headers)."""
    body = json.dumps({"error": {"message": message, "type": "server_error" if status >= 500 else
                                 "invalid_request_error", "param": None, "code": code}}).encode("ascii")
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode("ascii")
    return head + body


def guarded_protocol(header_timeout_s: float | None, max_connections: int | None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with a header deadline and a cap on open connections (None: no limit)."""
    late = _raw_response(408, "Request Timeout", f"the request's headers did not come within {header_timeout_s:g} s"
                         if header_timeout_s else "", "request_timeout")
    busy = _raw_response(503, "Service Unavailable", f"the server has {max_connections} connections open, the most "
                         "it takes; try again shortly", "server_busy")

    class GuardedProtocol(_BaseProtocol):
        _refused = False
        _header_timer: asyncio.TimerHandle | None = None
        _timed_cycle: Any = None  # the request cycle when the header deadline was set (None: before the first)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # a Transport, as uvicorn's own protocols say
            if max_connections is not None and len(self.server_state.connections) >= max_connections:
                self._refused = True
                transport.write(busy)
                transport.close()
                log.warning("refused a connection: %d are open, the most this server takes (--max-connections)",
                            len(self.server_state.connections))
                return
            super().connection_made(transport)
            self._set_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._clear_header_deadline()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)
            if self._header_timer is None and self._waiting_for_headers():
                self._set_header_deadline()  # the first byte of the next request on a kept-alive connection

        def _waiting_for_headers(self) -> bool:
            """No request under way (none yet, or the last one answered) and not idle between requests (uvicorn's
            keep-alive timer runs only then): part of a request line or its headers has come."""
            cycle = self.cycle
            return (cycle is None or cycle.response_complete) and self.timeout_keep_alive_task is None \
                and not self.transport.is_closing()

        def _set_header_deadline(self) -> None:
            if header_timeout_s is None:
                return
            self._timed_cycle = self.cycle
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _clear_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or not self._waiting_for_headers():
                return
            if self.cycle is not self._timed_cycle:  # that request's headers came; another one has begun since
                self._set_header_deadline()
                return
            self.transport.write(late)
            self.transport.close()

    return GuardedProtocol


class RepeatLimit(logging.Filter):
    """The same record (logger, level, first line of the message, exception type) passes at most once per
    `period_s`; the next one to pass says how many were held back meanwhile."""

    MAX_KEYS = 1000  # distinct records remembered; past it the memory starts again

    def __init__(self, period_s: float = LOG_REPEAT_S) -> None:
        super().__init__()
        self.period_s = period_s
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str, str], list[float]] = {}  # key -> [last passed (monotonic), held back]

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, str(record.msg).split("\n", 1)[0][:200], exc)
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.period_s:
                seen[1] += 1
                return False
            held = int(seen[1]) if seen is not None else 0
            if len(self._seen) >= self.MAX_KEYS:
                self._seen.clear()
            self._seen[key] = [now, 0]
        if held:
            record.msg = f"{record.msg} ({held:,} more like it held back in the last {self.period_s:g} s)"
        return True


# The loggers a flood of one error reaches: asyncio's (a failed accept, a callback's exception), uvicorn's,
# and the server's own.
FLOODED_LOGGERS = ("asyncio", "uvicorn.error", "engine.serve.app", "engine.serve.service", "engine.serve.running",
                   "engine.serve.engine_run", "engine.serve.connections", "engine.serve.proxy")
_REPEAT_LIMIT = RepeatLimit()


def limit_repeated_logs() -> RepeatLimit:
    """Install the repeat limit on the server's loggers (once per process); returns it."""
    for name in FLOODED_LOGGERS:
        logger = logging.getLogger(name)
        if _REPEAT_LIMIT not in logger.filters:
            logger.addFilter(_REPEAT_LIMIT)
    return _REPEAT_LIMIT
