"""The server on its own thread and event loop: `start_server(...) -> RunningServer`, `.url`, `.stop()`.

uvicorn's `Server` runs in a daemon thread with a new event loop, so the caller's loop (the window's Qt
loop, or the CLI's main thread waiting for Ctrl-C) never blocks on it. The socket is bound before the thread
starts, so a taken port or a bad address fails in the caller, in words. Stopping sets uvicorn's
`should_exit`, cancels every answer under way (each client's stream ends) and joins the thread. Each connection
has a deadline for its headers and a place among a bounded number (engine.serve.connections), and the same
error is logged at most once per LOG_REPEAT_S.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from engine.engine import Engine
from engine.serve.app import build_app
from engine.serve.connections import guarded_protocol, limit_repeated_logs
from engine.serve.exchange import ExchangeSink, Sinks
from engine.serve.limits import ACCEPT_BURST, CONNECTION_FD_RESERVE, KEEP_ALIVE_S, LISTEN_QUEUE
from engine.serve.service import EngineService, ServeOptions

log = logging.getLogger(__name__)

START_WAIT_S = 30.0


class ServeSetupError(ValueError):
    """The server cannot start as asked (an address, a port, a missing API key); the message says why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class RunningServer:
    """A server running on its own thread. `url` ends in /v1 (what an OpenAI client's base_url takes)."""

    host: str
    port: int
    service: Any  # EngineService or ProxyService
    _server: uvicorn.Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop_request(self, answer_id: str, timeout: float = 5.0) -> bool:
        """End one answer (its `ServedExchange.id`) as if the model had stopped: the client's stream gets a last
        chunk with finish_reason "stop" and `[DONE]`. Thread-safe; False when no such answer is under way."""
        return bool(self._on_loop(lambda: self.service.stop_request(answer_id), timeout))

    def active_requests(self, timeout: float = 5.0) -> list[str]:
        """The ids of the answers under way or waiting for the model. Thread-safe."""
        return list(self._on_loop(lambda: list(self.service.active), timeout) or [])

    def _on_loop(self, fn: Any, timeout: float) -> Any:
        loop = self._loop
        if loop is None or not self.running:
            return None
        result: Future[Any] = Future()

        def run() -> None:
            try:
                result.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                result.set_exception(e)

        loop.call_soon_threadsafe(run)
        return result.result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop answering: every answer under way is cancelled, then the thread ends (waited for up to `timeout`)."""
        if self.running:
            try:
                self._on_loop(lambda: [a.stop() for a in list(self.service.active.values())], timeout)
            except Exception:  # noqa: BLE001 - the loop is going away anyway
                log.debug("could not cancel the answers under way", exc_info=True)
        self._server.should_exit = True
        self._thread.join(timeout)

    def wait(self) -> None:
        """Block until the server ends (the CLI's foreground; Ctrl-C raises KeyboardInterrupt here)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        what = "is taken (another program listens on it)" if e.errno in (98, 48, 10048) else f"cannot be used: {e.strerror}"
        raise ServeSetupError(f"the address {host}:{port} {what}") from None
    sock.listen(LISTEN_QUEUE)
    sock.setblocking(False)
    return sock


def start_server(
    engine: Engine | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    sink: ExchangeSink | Sequence[ExchangeSink] | None = None,
    *,
    upstream: str | None = None,
    upstream_api_key: str | None = None,
    options: ServeOptions = ServeOptions(),
) -> RunningServer:
    """Serve `engine` (or, with `upstream`, forward to that OpenAI-compatible server) on `host:port`.

    Args:
        engine: the loaded model; None only with `upstream` (proxy mode).
        host: 127.0.0.1 by default; any other address needs `api_key`.
        port: 0 picks a free port (see `RunningServer.port`).
        api_key: every request but /health must send it (`Authorization: Bearer KEY`).
        sink: receives every served exchange live (`ExchangeSink`), on the server's thread.
        upstream: proxy mode: the base URL of another OpenAI-compatible server (usually ending in /v1).
        options: what is recorded per token, how many requests may wait.

    Raises:
        ServeSetupError: no engine and no upstream, another host without an API key, a taken port.
    """
    if not is_loopback(host) and not api_key:
        raise ServeSetupError(f"serving on {host} makes the model reachable from other machines: give an API key "
                              "(--api-key) so that only those who know it can use it")
    sinks = Sinks(list(sink) if isinstance(sink, Sequence) else [sink] if sink is not None else [])
    service = _service(engine, sinks, options, upstream, upstream_api_key)
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    limit_repeated_logs()
    config = uvicorn.Config(build_app(service, api_key, body_timeout_s=options.body_timeout_s), log_level="warning",
                            access_log=False, lifespan="off", timeout_graceful_shutdown=2, backlog=ACCEPT_BURST,
                            timeout_keep_alive=KEEP_ALIVE_S,
                            http=guarded_protocol(options.header_timeout_s, connection_cap(options.max_connections)))
    server = uvicorn.Server(config)
    holder: dict[str, Any] = {}
    started = threading.Event()
    thread = threading.Thread(target=_serve, args=(server, sock, service, holder, started),
                              name=f"logitlab-serve-{bound_port}", daemon=True)
    thread.start()
    started.wait(START_WAIT_S)
    running = RunningServer(host, bound_port, service, server, thread, holder.get("loop"))
    deadline = START_WAIT_S
    step = 0.01
    while not server.started and thread.is_alive() and deadline > 0:
        thread.join(step)
        deadline -= step
    if not server.started:
        running.stop(1.0)
        raise ServeSetupError(f"the server on {host}:{bound_port} did not start (see the log)")
    # asyncio listened with its backlog, which is also how many it accepts per turn (ACCEPT_BURST, kept small
    # for the descriptors); the system's queue goes back to LISTEN_QUEUE, so that a burst of clients waits
    # there instead of being retried a second later.
    sock.listen(LISTEN_QUEUE)
    return running


def _service(engine: Engine | None, sinks: Sinks, options: ServeOptions, upstream: str | None,
             upstream_api_key: str | None) -> Any:
    """What answers the requests: the engine's service, or with `upstream` the proxy's."""
    if upstream is not None:
        from engine.serve.proxy import ProxyService

        return ProxyService(upstream, sinks, options, api_key=upstream_api_key)
    if engine is not None:
        return EngineService(engine, sinks, options)
    raise ServeSetupError("give a model to serve, or --upstream URL to forward to another server")


def _serve(server: uvicorn.Server, sock: socket.socket, service: Any, holder: dict[str, Any],
           started: threading.Event) -> None:
    """The server's thread: its own event loop (put in `holder` before `started` is set), uvicorn on `sock`
    until stopped, then the service's connections closed, leftover tasks cancelled and the socket closed."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    holder["loop"] = loop
    started.set()
    try:
        loop.run_until_complete(server.serve(sockets=[sock]))
    except BaseException:  # noqa: BLE001 - logged: the thread has nobody to raise to
        log.exception("the server stopped with an error")
    finally:
        try:
            closer = getattr(service, "aclose", None)
            if closer is not None:
                loop.run_until_complete(closer())
            _cancel_leftovers(loop)
        finally:
            loop.close()
            sock.close()


def connection_cap(wanted: int | None) -> int | None:
    """`wanted`, lowered to what the process's open-file limit leaves room for: each connection is one file
    descriptor, those turned away hold one for a few turns of the loop (up to 4 * ACCEPT_BURST), and the model,
    its files and the log keep CONNECTION_FD_RESERVE. Past the limit accept() fails, asyncio logs it, and every
    client, /health included, times out."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to read
        return wanted
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = max(8, soft - CONNECTION_FD_RESERVE - 4 * ACCEPT_BURST)
    return room if wanted is None else min(wanted, room)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on the server's loop (sse-starlette's shutdown watcher) and let them end."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
