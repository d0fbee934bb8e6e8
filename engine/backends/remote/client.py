"""A small synchronous HTTP client for OpenAI-compatible servers, with one-line errors.

It runs on the model's worker thread (never the Qt thread), so a blocking
client is the simple and correct choice: one request at a time per model,
cancellation by closing the stream between chunks.

Retries: only idempotent requests (model list, tokenize, one-step
completions, which are pure functions of their input) are retried on
429/5xx, a bounded number of times with exponential backoff that honours
`Retry-After`. A streamed completion is never retried: it may have produced
tokens already.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx

from engine.backends.remote.errors import (
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


class ServerClient:
    """JSON over HTTP to one server; every failure becomes a `ServerError` naming the host."""

    def __init__(self, options: ConnectionOptions, transport: httpx.BaseTransport | None = None):
        self.options = options
        headers = {"Accept": "application/json"}
        if options.api_key:
            headers["Authorization"] = f"Bearer {options.api_key}"
        timeout = httpx.Timeout(options.timeout_s, connect=options.connect_timeout_s)
        self._http = httpx.Client(headers=headers, timeout=timeout, transport=transport, follow_redirects=True)
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
        for attempt in range(attempts):
            t0 = time.perf_counter()
            try:
                response = self._http.request(method, url, json=body)
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            if response.status_code in RETRY_STATUSES and attempt + 1 < attempts:
                wait = _retry_after(response) or min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
                log.info("%s %s answered %d; retrying in %.2f s", method, _path(url), response.status_code, wait)
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

    # --- streaming ------------------------------------------------------------

    def stream_events(self, path: str, body: dict) -> Iterator[dict]:
        """Server-sent events of a streamed completion, as dicts; closing the iterator closes the connection."""
        url = self.url(path)
        t0 = time.perf_counter()
        try:
            with self._http.stream("POST", url, json=body) as response:
                self.last_latency_s = time.perf_counter() - t0  # to the response headers: the stream's round trip
                if response.status_code >= 400:
                    response.read()
                    self._raise_for_status(response)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue  # comments, pings, event names, blank separators
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    try:
                        yield json.loads(data)
                    except ValueError:
                        raise ServerResponseError(f"{self.options.host} streamed a line that is not JSON: {data[:80]!r}") from None
        except httpx.HTTPError as e:
            raise self._transport_error(e, streaming=True) from None
        # The body ended without "[DONE]": the server (or a proxy) dropped the connection.
        raise StreamCutError(f"the connection to {self.options.host} ended in the middle of the answer")

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
