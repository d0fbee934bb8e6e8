"""A flood of one error from the real server is logged once per period with a count (issue 43 item 8: 1,100 slow
connections filled stderr with 91,387 tracebacks, 38 MB in 23 s).

tests/engine/test_serve_hostile_connections.py checks `RepeatLimit` on a logger of its own, and that a
descriptor flood never reaches "Too many open files"; neither fails when `start_server` does not put the
limit on the server's loggers. Here the server itself logs the flood: every connection past `--max-connections`
is refused with a warning, 40 of them in a burst are one line, and the next one after the period says how many
were held back.
"""

from __future__ import annotations

import logging
import socket
import time

import pytest

from engine.serve import ServeOptions, start_server
from engine.serve import connections

pytestmark = [pytest.mark.model]
PERIOD_S = 0.5  # the server's is 10 s; the same limit object, its period shortened so the test waits it out
BURST = 40


def _refused(server) -> bytes:
    """Open one connection past the cap and read what the server sends before it closes it."""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_the_servers_refusals_past_the_cap_are_logged_once_per_period_with_a_count(monkeypatch, caplog):
    from engine import Engine

    limit = connections._REPEAT_LIMIT  # the one start_server puts on the server's loggers
    monkeypatch.setattr(limit, "period_s", PERIOD_S)
    monkeypatch.setattr(limit, "_seen", {})  # nothing an earlier test logged in this process holds this one back
    for name in connections.FLOODED_LOGGERS:  # taken off where an earlier server put it: start_server must put it back
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "filters", [f for f in logger.filters if f is not limit])
    caplog.set_level(logging.WARNING, logger="engine.serve.connections")
    with Engine.load() as engine:
        server = start_server(engine, options=ServeOptions(max_connections=2, header_timeout_s=30))
        held = []
        try:
            for _ in range(2):  # the two places the cap allows, each holding half a request
                sock = socket.create_connection((server.host, server.port), timeout=5)
                sock.sendall(b"GET /health HTTP/1.1\r\n")
                held.append(sock)
            time.sleep(0.2)
            started = time.monotonic()
            answers = [_refused(server) for _ in range(BURST)]
            burst_s = time.monotonic() - started
            assert all(a.startswith(b"HTTP/1.1 503 ") and b"server_busy" in a for a in answers)
            in_burst = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
            time.sleep(PERIOD_S + 0.1)
            assert _refused(server).startswith(b"HTTP/1.1 503 ")
        finally:
            for sock in held:
                sock.close()
            server.stop()
    every = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    if burst_s < PERIOD_S:  # the usual case (a refusal takes about a millisecond): one line for the whole burst
        assert len(in_burst) == 1, in_burst
        assert len(every) == 2, every
        assert f"({BURST - 1:,} more like it held back in the last {PERIOD_S:g} s)" in every[1], every
    else:  # a machine so loaded that the burst outlasted the period: still far fewer lines than refusals
        assert len(every) <= burst_s / PERIOD_S + 2 < BURST, every
