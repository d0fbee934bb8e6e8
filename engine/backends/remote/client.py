"""A small synchronous HTTP client for OpenAI-compatible servers, with one-line errors.

It runs on the model's worker thread (never the Qt thread), so a blocking
client is the simple and correct choice: one request at a time per model,
cancellation by closing the stream between chunks.

Retries: only idempotent requests (model list, tokenize, one-step
completions, which are pure functions of their input) are retried on
429/5xx, a bounded number of times with exponential backoff that honours
`Retry-After`. A streamed completion is never retried: it may have produced
tokens already.

Cancelling and stalls: a request waits on a helper thread while this one
watches the clock and, inside `cancellable(event)` (one run on the worker
thread), the event, so a cancel (Ctrl-C, Stop) returns within
`CANCEL_POLL_S` even when the server never answers, and an answer that
trickles in byte by byte ends after the timeout (httpx's read timeout
restarts on every byte and would never fire). A stream is read on a helper
thread too: the timeout then runs from one complete event to the next.

Sizes: a server's answer is read up to `MAX_RESPONSE_BYTES` and a streamed
event up to `MAX_EVENT_BYTES`, then refused in words (an endless /v1/models
body would otherwise be buffered until memory runs out). An address httpx
cannot use (`InvalidURL`) is said in words too, never with its credentials.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

import httpx

from engine.backends.remote.bounded import (
    MAX_ERROR_BYTES,
    MAX_EVENT_BYTES,
    MAX_RESPONSE_BYTES,
    LineTooLong,
    bounded_lines,
    detached,
    read_at_most,
)
from engine.backends.remote.errors import (
    RequestCancelledError,
    ServerAuthError,
    ServerResponseError,
    ServerTimeoutError,
    ServerUnreachableError,
    StreamCutError,
)
from engine.backends.remote.options import ConnectionOptions

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_S = 0.25  # first wait; doubles each retry
MAX_BACKOFF_S = 4.0
CANCEL_POLL_S = 0.05  # how often a waiting request looks at its cancel event

T = TypeVar("T")
_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("logitlab_remote_cancel", default=None)


class _End:
    """The mark a stream's reader thread puts last: it is done."""


_END = _End()
# What a stream's reader thread hands over: the response (headers read), a line, its failure, or the end.
_StreamItem = httpx.Response | BaseException | str | _End


@contextlib.contextmanager
def cancellable(cancel: threading.Event | None) -> Iterator[None]:
    """Requests made in this block (on this thread) end with RequestCancelledError as soon as `cancel` is set."""
    token = _CANCEL.set(cancel)
    try:
        yield
    finally:
        _CANCEL.reset(token)


class ServerClient:
    """JSON over HTTP to one server; every failure becomes a `ServerError` naming the host."""

    def __init__(self, options: ConnectionOptions, transport: httpx.BaseTransport | None = None):
        self.options = options
        headers = {"Accept": "application/json"}
        if options.api_key:
            headers["Authorization"] = f"Bearer {options.api_key}"
        timeout = httpx.Timeout(options.timeout_s, connect=options.connect_timeout_s)
        # Credentials from the URL go as Basic auth, as the URL asked; an API key (Bearer) wins over them.
        auth = httpx.BasicAuth(*options.basic_auth) if options.basic_auth and not options.api_key else None
        self._http = httpx.Client(headers=headers, timeout=timeout, transport=transport, follow_redirects=True,
                                  auth=auth)
        self.last_latency_s: float | None = None  # round trip of the last complete request

    def url(self, path: str, root: bool = False) -> str:
        base = self.options.server_root if root else self.options.base_url.rstrip("/")
        return base + path

    # --- plain requests -------------------------------------------------------

    def get_json(self, path: str, *, root: bool = False) -> Any:
        return self._request("GET", self.url(path, root), None, idempotent=True)

    def post_json(self, path: str, body: dict, *, root: bool = False, idempotent: bool = True, retry: bool = True) -> Any:
        return self._request("POST", self.url(path, root), body, idempotent=idempotent and retry)

    def _request(self, method: str, url: str, body: dict | None, idempotent: bool) -> Any:
        attempts = 1 + (self.options.retries if idempotent else 0)
        cancel = _CANCEL.get()
        for attempt in range(attempts):
            t0 = time.perf_counter()
            try:
                response = _watching(cancel, self.options.timeout_s, self.options.host,
                                     lambda: self._bounded(method, url, body))
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            except httpx.InvalidURL as e:
                raise self._invalid_url(e) from None
            if response.status_code in RETRY_STATUSES and attempt + 1 < attempts:
                wait = _retry_after(response) or min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
                log.info("%s %s answered %d; retrying in %.2f s", method, _path(url), response.status_code, wait)
                if cancel is not None and cancel.wait(wait):
                    raise RequestCancelledError("cancelled")
                if cancel is None:
                    time.sleep(wait)
                continue
            self.last_latency_s = time.perf_counter() - t0
            self._raise_for_status(response)
            try:
                return response.json()
            except ValueError:
                raise ServerResponseError(
                    f"{self.options.host} answered {_path(url)} with something that is not JSON: "
                    "is this an OpenAI-compatible server (the URL usually ends in /v1)?"
                ) from None
        raise AssertionError("unreachable")

    def _bounded(self, method: str, url: str, body: dict | None) -> httpx.Response:
        """The response with its body read up to MAX_RESPONSE_BYTES (ServerResponseError past that)."""
        with self._http.stream(method, url, json=body) as response:
            declared = response.headers.get("content-length", "").strip()
            if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
                raise self._too_large(url, int(declared))
            content, whole = read_at_most(response, MAX_RESPONSE_BYTES)
            if not whole:
                raise self._too_large(url, MAX_RESPONSE_BYTES)
        return detached(response, content)

    def _too_large(self, url: str, size: int) -> ServerResponseError:
        return ServerResponseError(
            f"{self.options.host} answered {_path(url)} with more than {MAX_RESPONSE_BYTES // 2**20} MiB "
            f"({size:,} bytes or more): no answer of the OpenAI API is that large, so it was refused"
        )

    def _invalid_url(self, e: Exception) -> ServerResponseError:
        # httpx's message may quote the address; the base URL holds no credentials, but say only the host.
        return ServerResponseError(f"the server address {self.options.host!r} cannot be used: {type(e).__name__}")

    # --- streaming ------------------------------------------------------------

    def stream_events(self, path: str, body: dict, cancel: threading.Event | None = None
                      ) -> Generator[dict, None, None]:
        """Server-sent events of a streamed completion, as dicts; closing the iterator closes the connection.

        The body is read on a helper thread. Here, each wait for the next event lasts at most the timeout
        (else ServerTimeoutError: a trickle of bytes that never completes an event is a stalled server) and
        ends early when `cancel` is set (RequestCancelledError).
        """
        url = self.url(path)
        host = self.options.host
        lines: queue.SimpleQueue[_StreamItem] = queue.SimpleQueue()
        opened: dict[str, Any] = {}
        stop = threading.Event()

        def read() -> None:
            try:
                with self._http.stream("POST", url, json=body) as response:
                    opened["response"] = response
                    if response.status_code >= 400:  # its words, for the error: read within a limit
                        lines.put(detached(response, read_at_most(response, MAX_ERROR_BYTES)[0]))
                        return
                    lines.put(response)
                    for line in bounded_lines(response, MAX_EVENT_BYTES):
                        if stop.is_set():
                            return
                        lines.put(line)
            except BaseException as e:  # noqa: BLE001 - handed to the reading side
                lines.put(e)
            finally:
                lines.put(_END)

        t0 = time.perf_counter()
        threading.Thread(target=read, name="logitlab-stream", daemon=True).start()
        timeout = self.options.timeout_s
        response: httpx.Response | None = None
        ended = False  # the reader is done (it closed the response itself)
        before_data: list[str] = []  # what came before the first "data:" line (a JSON error document?)
        seen_data = False
        deadline = time.monotonic() + timeout  # moved on by every event, not by pings or a trickle of bytes
        try:
            while True:
                item = _next_line(lines, cancel, deadline, timeout, host, response is not None)
                if isinstance(item, httpx.Response):
                    response = item
                    self.last_latency_s = time.perf_counter() - t0  # to the response headers: the stream's round trip
                    continue
                if isinstance(item, _End):
                    ended = True
                    break
                if isinstance(item, BaseException):
                    raise self._stream_failure(item) from None
                if not item.startswith("data:"):
                    if not seen_data and sum(map(len, before_data)) < 65536:
                        before_data.append(item)
                    continue  # comments, pings, event names, blank separators
                seen_data = True
                deadline = time.monotonic() + timeout
                data = item[len("data:") :].strip()
                if data == "[DONE]":
                    return
                try:
                    yield json.loads(data)
                except ValueError:
                    raise ServerResponseError(f"{host} streamed a line that is not JSON: {data[:80]!r}") from None
        finally:
            stop.set()
            if not ended:
                _abort(opened.get("response"))
        if response is not None and response.status_code >= 400:
            self._raise_for_status(response)
        if not seen_data and "".join(before_data).strip():
            raise self._not_a_stream("\n".join(before_data))
        # The body ended without "[DONE]": the server (or a proxy) dropped the connection.
        raise StreamCutError(f"the connection to {host} ended in the middle of the answer, without its end marker")

    def _stream_failure(self, error: BaseException) -> BaseException:
        """What the reading thread's `error` is to the caller: a transport failure or an overlong event said in
        words, anything else (a cancel, an interrupt) as it is."""
        if isinstance(error, httpx.HTTPError):
            return self._transport_error(error, streaming=True)
        if isinstance(error, httpx.InvalidURL):
            return self._invalid_url(error)
        if isinstance(error, LineTooLong):
            return ServerResponseError(f"{self.options.host} streamed an event longer than "
                                       f"{MAX_EVENT_BYTES // 2**20} MiB without ending it: the answer was refused there")
        return error

    def _not_a_stream(self, body: str) -> ServerResponseError:
        """A whole answer where a stream (server-sent events) was asked for: say what came, in its own words."""
        host = self.options.host
        try:
            doc = json.loads(body)
        except ValueError:
            return ServerResponseError(
                f"{host} answered a streamed request with something that is not a stream: {_first_line(body)[:120]!r}"
            )
        err = doc.get("error") or doc.get("detail") if isinstance(doc, dict) else None
        if err:
            detail = _first_line(str(err.get("message", err) if isinstance(err, dict) else err))[:200]
            return ServerResponseError(f"{host} answered with an error instead of a stream: {detail}")
        return ServerResponseError(
            f"{host} answered a streamed request with one JSON document instead of a stream of events: "
            "it does not seem to support streaming (stream=true)"
        )

    # --- error translation ----------------------------------------------------

    def _raise_for_status(self, response: httpx.Response) -> None:
        code = response.status_code
        if code < 400:
            return
        host = self.options.host
        detail = _error_detail(response)
        if code in (401, 403):
            key = "the API key was refused" if self.options.api_key else f"it needs an API key (set ${'LOGITLAB_API_KEY'} or enter one)"
            raise ServerAuthError(f"{host} answered {code}: {key}{': ' + detail if detail else ''}")
        if code == 404:
            raise ServerResponseError(f"{host} has no {_path(str(response.url))} ({code}): check the URL (it usually ends in /v1)")
        if code == 429:
            raise ServerResponseError(f"{host} is rate-limiting requests (429) and kept doing so after retries{': ' + detail if detail else ''}")
        if code >= 500:
            raise ServerResponseError(f"{host} had an internal error ({code}){': ' + detail if detail else ''}")
        raise ServerResponseError(f"{host} refused the request ({code}){': ' + detail if detail else ''}")

    def _transport_error(self, e: httpx.HTTPError, streaming: bool = False) -> Exception:
        host = self.options.host
        text = str(e)
        if isinstance(e, httpx.ConnectTimeout):
            return ServerTimeoutError(f"{host} did not accept a connection within {self.options.connect_timeout_s:g} s")
        if isinstance(e, httpx.TimeoutException):
            return ServerTimeoutError(
                f"{host} did not answer within {self.options.timeout_s:g} s (the timeout can be raised in the connection settings)"
            )
        if isinstance(e, httpx.ConnectError):
            low = text.lower()
            if "certificate" in low or "ssl" in low or "tls" in low:
                return ServerUnreachableError(f"TLS handshake with {host} failed: {_first_line(text)}")
            if "name or service not known" in low or "nodename nor servname" in low or "getaddrinfo" in low or "name resolution" in low:
                return ServerUnreachableError(f"the host name in {host} cannot be resolved (DNS): check the URL")
            if "refused" in low:
                return ServerUnreachableError(f"nothing is listening at {host} (connection refused): is the server running?")
            return ServerUnreachableError(f"cannot connect to {host}: {_first_line(text)}")
        if streaming and isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
            return StreamCutError(f"the connection to {host} ended in the middle of the answer")
        return ServerResponseError(f"talking to {host} failed: {_first_line(text) or type(e).__name__}")

    def close(self) -> None:
        self._http.close()


def _watching(cancel: threading.Event | None, timeout: float, host: str, call: Callable[[], T]) -> T:
    """`call()` on a helper thread, abandoned when `cancel` is set or after `timeout` seconds in all (httpx's own
    timeout restarts with every byte, so an answer that trickles in would otherwise never time out)."""
    if cancel is not None and cancel.is_set():
        raise RequestCancelledError("cancelled")
    deadline = time.monotonic() + timeout
    box: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e
        finally:
            finished.set()

    threading.Thread(target=run, name="logitlab-request", daemon=True).start()
    while not finished.wait(CANCEL_POLL_S):
        if cancel is not None and cancel.is_set():
            raise RequestCancelledError("cancelled")
        if time.monotonic() > deadline:
            raise ServerTimeoutError(
                f"{host} did not finish answering within {timeout:g} s (the timeout can be raised in the "
                "connection settings)"
            )
    if "error" in box:
        raise box["error"]
    return box["value"]


def _next_line(
    lines: queue.SimpleQueue[_StreamItem], cancel: threading.Event | None, deadline: float, timeout: float, host: str,
    started: bool,
) -> _StreamItem:
    """The stream reader's next item, waiting until `deadline` (time.monotonic) and watching `cancel`."""
    while True:
        if cancel is not None and cancel.is_set():
            raise RequestCancelledError("cancelled")
        left = deadline - time.monotonic()
        if left <= 0:
            what = f"sent no complete token for {timeout:g} s" if started else f"did not answer within {timeout:g} s"
            raise ServerTimeoutError(f"{host} {what} (the timeout can be raised in the connection settings)")
        try:
            return lines.get(timeout=min(CANCEL_POLL_S, left))
        except queue.Empty:
            continue


def _abort(response: httpx.Response | None) -> None:
    """End a stream whose reader may be blocked: shut its socket down (the reader wakes, the server sees the
    connection go and stops generating), then close the response off this thread."""
    if response is None:
        return
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    threading.Thread(target=response.close, name="logitlab-stream-close", daemon=True).start()


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), MAX_BACKOFF_S) if value else None
    except ValueError:
        return None


def _error_detail(response: httpx.Response) -> str:
    """The server's own words about an error, shortened to one line."""
    try:
        doc = response.json()
    except ValueError:
        return _first_line(response.text)[:200]
    err = doc.get("error", doc.get("detail", "")) if isinstance(doc, dict) else ""
    if isinstance(err, dict):
        err = err.get("message", "")
    if isinstance(err, list):  # FastAPI validation errors
        err = "; ".join(str(x.get("msg", x)) if isinstance(x, dict) else str(x) for x in err)
    return _first_line(str(err))[:200]


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _path(url: str) -> str:
    return httpx.URL(url).path
