"""What the server tests share: the default model served on 127.0.0.1, and a sink that keeps what it is told."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator

from engine.events import TokenEvent
from engine.serve import RunningServer, ServedExchange, start_server


class RecordingSink:
    """Keeps every call it gets, in order; `wait_ends(n)` waits until n exchanges have ended."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.started: list[ServedExchange] = []
        self.ended: list[ServedExchange] = []
        self.tokens: dict[str, list[tuple[int, TokenEvent]]] = {}
        self.threads: set[str] = set()
        self._changed = threading.Condition()

    def on_start(self, exchange: ServedExchange) -> None:
        with self._changed:
            self.threads.add(threading.current_thread().name)
            self.calls.append(("start", exchange.id))
            self.started.append(exchange)
            self._changed.notify_all()

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        with self._changed:
            self.calls.append(("token", exchange_id))
            self.tokens.setdefault(exchange_id, []).append((choice, event))

    def on_end(self, exchange: ServedExchange) -> None:
        with self._changed:
            self.calls.append(("end", exchange.id))
            self.ended.append(exchange)
            self._changed.notify_all()

    def clear(self) -> None:
        with self._changed:
            self.calls.clear()
            self.started.clear()
            self.ended.clear()
            self.tokens.clear()

    def wait_ends(self, n: int, timeout: float = 60.0) -> list[ServedExchange]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.ended) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(self.ended)} of {n} exchanges ended within {timeout} s"
                self._changed.wait(left)
            return list(self.ended)

    def wait_starts(self, n: int, timeout: float = 60.0) -> list[ServedExchange]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.started) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(self.started)} of {n} exchanges started within {timeout} s"
                self._changed.wait(left)
            return list(self.started)


@contextmanager
def served_default_model(**kwargs) -> Iterator[tuple[object, RunningServer, RecordingSink]]:
    """The default model (llama.cpp) in an Engine, served on 127.0.0.1 on a free port, with a RecordingSink."""
    from engine import Engine

    engine = Engine.load()
    sink = RecordingSink()
    server = start_server(engine, sink=sink, **kwargs)
    try:
        yield engine, server, sink
    finally:
        server.stop()
        engine.close()
