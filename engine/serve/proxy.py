"""Proxy mode: each request goes to another OpenAI-compatible server, and its answer is recorded like ours.

Chat and text completions, OpenAI's Responses (`/v1/responses`) and Anthropic's Messages (`/v1/messages`,
`/v1/messages/count_tokens`) are forwarded to the same route of the upstream; each API's reading of its
answer (what to ask, what to record, what to take out again) is its shape's (engine.serve.proxy_openai,
proxy_responses, proxy_messages). The client's body is forwarded as it is: the record has the log-probs the
client asked for (its text pieces alone when it asked none), because asking more behind llama.cpp's server
costs several times the plain answer's time and can change its greedy text. `options.upstream_top_n` N
(`--upstream-top-n`) asks for more: the chosen token's log-prob and max(N, the client's) alternatives (none
in Anthropic's API, which has none), so the record has them; what the client did not ask for is taken out of
the answer again before it reaches the client (and alternatives beyond the number it asked for). An upstream
that refuses that request (4xx but 404) is asked again with the client's own body, and the record then has
the tokens' text only. The upstream's errors reach the client with the upstream's status and words
(in the route's API's error shape); a 404 for Responses or Messages says the upstream may not have that API.
Nothing but the configured upstream is ever contacted.

The upstream is not trusted (engine.serve.proxy_read, engine.serve.proxy_limits): an answer past the caps on
bytes and tokens, or one that is not what the API says (a JSON list, an `index` of "abc", status 600, a chunk
`[1,2]`), gets 502 `bad_upstream` (a stream: the usual error event, then `[DONE]`); a request that finds every
connection to the upstream taken waits `pool_wait_s`, then gets 503 `upstream_busy`. A client that leaves
closes its upstream call, whether it waits for a whole answer, for a stream's headers or in the middle of one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from engine.backends.remote.errors import ServerError
from engine.events import FinishReason
from engine.serve import fields as f
from engine.serve.body import client_address
from engine.serve.errors import ApiError
from engine.serve.exchange import ExchangeEndpoint, ServedChoice, ServedExchange, Sinks
from engine.serve.parse import read_sampler
from engine.serve.proxy_limits import PROXY_MAX_ERROR_BYTES
from engine.serve.proxy_messages import MessagesShape
from engine.serve.proxy_openai import OpenAiShape
from engine.serve.proxy_read import BadUpstream, passable, read_whole, sse_events, upstream_json
from engine.serve.proxy_responses import ResponsesShape
from engine.serve.service import ServeOptions
from engine.top_n import TOP_LOGPROBS_MAX

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# Each API's reading of its requests, answers and events (what to ask, record and take out again).
Shape = OpenAiShape | ResponsesShape | MessagesShape
_SHAPES: dict[str, type[Shape]] = {"chat.completions": OpenAiShape, "completions": OpenAiShape,
                                   "responses": ResponsesShape, "messages": MessagesShape}
_OTHER_APIS = ("responses", "messages")  # not OpenAI's chat: an upstream may well not have them


class _ClientGone(Exception):
    """The client hung up while the proxy waited on the upstream."""


class _Answer:
    """A proxied answer under way: what stopping it and recording its end need."""

    def __init__(self, exchange: ServedExchange, shape: Shape, response: httpx.Response, seed: int | None,
                 t0: float) -> None:
        self.exchange = exchange
        # One record per prompt, as the engine's own server keeps a list of prompts (`<id>-<p>`, `n` choices
        # each): the upstream's choice p * n + j is choice j of record p.
        self.parts = shape.records(exchange)
        self.per = exchange.n
        self.shape = shape
        self.choices = shape.new_choices()
        self.response = response
        self.seed = seed
        self.t0 = t0  # when the request was sent: a whole answer's headers come only when it is finished
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        asyncio.ensure_future(self.response.aclose())  # the read in progress ends; the upstream stops

    def tokens(self) -> int:
        return sum(len(c.events) for c in self.choices)


class _ProxiedStream(EventSourceResponse):
    """An event stream that closes its upstream response and ends its record however it ends, even when the
    client left before the stream's generator ever ran (its own `finally` then never runs)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, ping=15)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.on_close()


class ProxyService:
    """Answers by forwarding to `upstream` (a base URL, usually ending in /v1), within `options.proxy`'s limits."""

    def __init__(self, upstream: str, sinks: Sinks, options: ServeOptions = ServeOptions(),
                 api_key: str | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.sinks = sinks
        self.options = options
        self.limits = options.proxy
        # identity: a compressed answer would be inflated by httpx a network read at a time, past any count of ours
        headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        lim = self.limits
        self.http = httpx.AsyncClient(
            headers=headers, follow_redirects=False,
            timeout=httpx.Timeout(lim.read_timeout_s, connect=lim.connect_timeout_s, pool=lim.pool_wait_s),
            limits=httpx.Limits(max_connections=lim.max_connections,
                                max_keepalive_connections=min(20, lim.max_connections)))
        self.model_name = ""
        self.active: dict[str, _Answer] = {}

    async def aclose(self) -> None:
        await self.http.aclose()

    def stop_request(self, answer_id: str) -> bool:
        answer = self.active.get(answer_id)
        if answer is None:
            return False
        answer.stop()
        return True

    # --- plain routes: forwarded -----------------------------------------------------------------------------

    async def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            async with self.http.stream(method, url, json=body) as response:
                if not 200 <= response.status_code < 300:
                    raise _upstream_error(self.upstream, response.status_code, await _error_bytes(response))
                doc = upstream_json(await read_whole(response, self.limits.max_answer_bytes))
        except httpx.PoolTimeout:
            raise self._busy() from None
        except (httpx.HTTPError, httpx.StreamError) as e:
            raise _unreachable(self.upstream, e) from None
        except BadUpstream as e:
            raise self._bad(e) from None
        if not isinstance(doc, dict):
            raise ApiError(502, f"{url} answered with JSON that is not an object", code="bad_upstream")
        return doc

    def _root(self) -> str:
        return self.upstream[: -len("/v1")] if self.upstream.endswith("/v1") else self.upstream

    async def models(self) -> dict[str, Any]:
        return await self._call("GET", self.upstream + "/models")

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", self._root() + "/tokenize", body)

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", self._root() + "/detokenize", body)

    async def props(self) -> dict[str, Any]:
        return await self._call("GET", self._root() + "/props")

    # --- answers -------------------------------------------------------------------------------------------

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        """Anthropic's `/v1/messages/count_tokens`, forwarded."""
        try:
            return await self._call("POST", self.upstream + "/messages/count_tokens", body)
        except ApiError as e:
            if e.status == 404:
                raise _no_such_api(self.upstream, "/messages/count_tokens", e) from None
            raise

    async def answer(self, endpoint: ExchangeEndpoint, body: dict[str, Any], request: Request) -> Response:
        """Chat and text completions, Responses and Anthropic Messages: forwarded, recorded, passed back."""
        shape = _SHAPES[endpoint](endpoint, body)
        stream = f.flag(body, "stream")
        model = f.text(body, "model") or ""
        top = self.options.upstream_top_n
        forwarded = body if top is None else shape.forwarded(min(top, TOP_LOGPROBS_MAX))
        try:
            sampler = read_sampler(body)
        except ApiError:
            sampler = None  # fields the upstream may know and we do not: the record has no settings
        answer_id = shape.id_prefix + secrets.token_hex(12)
        messages, prompt = shape.exchange_fields()
        exchange = ServedExchange(
            id=answer_id, endpoint=endpoint, model=model, client=client_address(request), proxied=True,
            upstream=self.upstream, messages=messages, prompt=prompt, prompt_ids=(), sampler=sampler, request=None,
            n=getattr(shape, "n", 1), stream=stream, body=body,
        )
        url = self.upstream + shape.path
        t0 = time.perf_counter()
        try:
            # A whole answer's headers come when the upstream has finished it: a client that leaves meanwhile
            # must not hold a connection to the upstream (and the upstream's work) for the read timeout.
            response = await self._until_gone(self._open(url, forwarded, body, shape), request)
        except _ClientGone:
            return Response(status_code=499)  # nobody to answer; nothing was recorded yet
        seed = body.get("seed") if isinstance(body.get("seed"), int) else None
        answer = _Answer(exchange, shape, response, seed, t0)
        for part in answer.parts:
            self.active[part.id] = answer
            self.sinks.on_start(part)
        if stream:
            async def on_close() -> None:
                await response.aclose()
                self._end(answer, disconnected=True)  # a no-op when the stream recorded its own end

            return _ProxiedStream(self._stream(answer), on_close)
        return await self._whole(answer, request)

    async def _until_gone(self, work: Awaitable[_T], request: Request) -> _T:
        """`work`'s response; `_ClientGone` (the work cancelled, its connection closed) when the client hangs up first."""
        task = asyncio.ensure_future(work)
        gone = False
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.limits.disconnect_poll_s)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    gone = True
                    raise _ClientGone
        finally:
            if not task.done():
                task.cancel()
            if gone or not task.done():
                task.add_done_callback(_close_orphan)

    async def _open(self, url: str, forwarded: dict[str, Any], body: dict[str, Any], shape: Shape) -> httpx.Response:
        """The upstream's response, headers read; its error, with its status, when it refused."""
        for attempt, payload in enumerate((forwarded, body)):
            try:
                response = await self.http.send(self.http.build_request("POST", url, json=payload), stream=True)
            except httpx.PoolTimeout:
                raise self._busy() from None
            except httpx.HTTPError as e:
                raise _unreachable(self.upstream, e) from None
            status = response.status_code
            kind = response.headers.get("content-type", "")
            if 200 <= status < 300 and payload.get("stream") is True and kind and "event-stream" not in kind:
                await response.aclose()  # a document where a stream was asked for: an error page, a proxy's HTML
                raise self._bad(BadUpstream(f"answered a stream request with {kind[:60]}, not an event stream"))
            if 200 <= status < 300:
                return response
            try:
                raw = await _error_bytes(response)
            except (httpx.HTTPError, httpx.StreamError) as e:
                raise _unreachable(self.upstream, e) from None
            finally:
                await response.aclose()
            if status == 404 and shape.endpoint in _OTHER_APIS:
                raise _no_such_api(self.upstream, shape.path, _upstream_error(self.upstream, status, raw))
            if 400 <= status < 500 and status != 404 and attempt == 0 and forwarded is not body:
                log.info("%s refused the request with log-probs (%d); forwarding it as the client sent it",
                         self.upstream, status)
                continue
            raise _upstream_error(self.upstream, status, raw)
        raise AssertionError("unreachable")

    def _busy(self) -> ApiError:
        return ApiError(503, f"all {self.limits.max_connections} connections to the upstream server {self.upstream} "
                             f"stayed busy for {self.limits.pool_wait_s:g} s; try again shortly", code="upstream_busy")

    def _bad(self, e: BadUpstream) -> ApiError:
        return ApiError(502, f"the upstream server {self.upstream} {e}", code="bad_upstream")

    def _too_many_tokens(self, answer: _Answer) -> None:
        if answer.tokens() > self.limits.max_answer_tokens:
            raise BadUpstream(f"sent more than {self.limits.max_answer_tokens:,} tokens, the most this proxy "
                              "records of one answer")

    async def _whole(self, answer: _Answer, request: Request) -> Response:
        response = answer.response
        try:
            raw = await self._until_gone(read_whole(response, self.limits.max_answer_bytes), request)
            doc = upstream_json(raw)
            del raw
            answer.shape.whole(doc, answer.choices)  # recorded, and trimmed to what the client asked
            self._too_many_tokens(answer)
            content = passable(doc)
        except _ClientGone:
            self._end(answer, disconnected=True)
            return Response(status_code=499)
        except BadUpstream as e:
            self._end(answer, error=f"the upstream's answer could not be passed on: {e}")
            raise self._bad(e) from None
        except Exception as e:
            if answer.stopped:  # Stop while the upstream was still working on a whole answer: nothing to show yet
                self._end(answer)
                raise ApiError(503, "the answer was stopped on this server before the upstream finished it",
                               code="stopped") from None
            if not isinstance(e, (httpx.HTTPError, httpx.StreamError)):
                raise
            self._end(answer, error=f"the upstream's answer could not be read: {e}")
            raise ApiError(502, f"the upstream server {self.upstream}'s answer could not be read: "
                                f"{type(e).__name__}: {e}", code="bad_upstream") from None
        finally:
            await response.aclose()
        self._end(answer, error=answer.shape.error)
        return Response(content, media_type="application/json")

    async def _stream(self, answer: _Answer) -> AsyncIterator[Any]:
        shape = answer.shape
        lim = self.limits
        ended = False
        events = 0
        try:
            try:
                async for name, data in sse_events(answer.response, lim.max_answer_bytes, lim.max_line_bytes):
                    events += 1
                    if data == "[DONE]":
                        break
                    chunk = upstream_json(data)
                    for i, new in shape.event(name, chunk, answer.choices):  # recorded, and trimmed
                        for event in new:
                            self.sinks.on_token(answer.parts[i // answer.per].id, i % answer.per, event)
                    self._too_many_tokens(answer)
                    yield shape.passed(name, passable(chunk).decode("utf-8"))
                    # An upstream that sends as fast as we read never makes a read wait, so without this turn
                    # one endless stream would hold the loop, and /health, every other client, for seconds.
                    await asyncio.sleep(0)
                if not events:
                    raise BadUpstream("ended the stream without sending any event")
            except (httpx.HTTPError, httpx.StreamError, BadUpstream, ServerError, ValueError) as e:
                if not answer.stopped:
                    ended = True
                    err = self._bad(e) if isinstance(e, BadUpstream) else ApiError(
                        502, f"{self.upstream}'s stream failed: {e}", code="bad_upstream")
                    self._end(answer, error=err.message)
                    for item in (*shape.failed(err), *shape.done):
                        yield item
                    return
            tail = shape.stopped(answer.exchange, answer.choices) if answer.stopped else []
            ended = True
            self._end(answer, error=shape.error)
            for item in (*tail, *shape.done):  # the window's Stop: the client's stream ends like a finished answer
                yield item
        finally:
            with anyio.CancelScope(shield=True):  # the client left: the task is cancelled, the close must still run
                await answer.response.aclose()
            if not ended:
                self._end(answer, disconnected=True)

    def _end(self, answer: _Answer, *, error: str | None = None, disconnected: bool = False) -> None:
        popped = [self.active.pop(part.id, None) for part in answer.parts]
        if popped[0] is None:
            return  # ended already
        ended: FinishReason | None = "cancelled" if (answer.stopped or disconnected) else ("error" if error else None)
        choices = []
        for i, c in enumerate(answer.choices):
            stats = c.stats(answer.t0, answer.shape.prompt_tokens, answer.seed,
                            ended if c.finish is None or error else None, error)
            if error:
                reason = "error"
            elif c.finish is None:
                reason = "cancelled" if disconnected else "stop"  # gone before the end; or the window's Stop
            else:
                reason = c.finish
            choices.append(ServedChoice(i % answer.per, tuple(c.events), stats, reason))
        finished = time.time()
        for p, part in enumerate(answer.parts):
            mine = tuple(choices[p * answer.per:(p + 1) * answer.per])
            self.sinks.on_end(dataclasses.replace(part, finished_at=finished, choices=mine, error=error,
                                                  stopped=answer.stopped, disconnected=disconnected))


def _close_orphan(task: "asyncio.Future[Any]") -> None:
    """A watched upstream call nobody waits for any more: its error is dropped, its response closed."""
    if task.cancelled() or task.exception() is not None:
        return
    result = task.result()
    if isinstance(result, httpx.Response):
        asyncio.ensure_future(result.aclose())


async def _error_bytes(response: httpx.Response) -> bytes:
    """The start of an upstream's refusal (only its first line is passed on): at most PROXY_MAX_ERROR_BYTES."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= PROXY_MAX_ERROR_BYTES:
            break
    return b"".join(chunks)[:PROXY_MAX_ERROR_BYTES]


def _upstream_error(upstream: str, status: int, raw: bytes) -> ApiError:
    """The upstream's refusal, passed on with its status and its words (a status that is no HTTP error: 502)."""
    if not 400 <= status <= 599:
        return ApiError(502, f"the upstream server {upstream} answered with HTTP status {status}, which is neither "
                             "an answer nor an error", code="bad_upstream")
    try:
        doc = upstream_json(raw)
        err = doc.get("error", doc.get("detail")) if isinstance(doc, dict) else None
        words = err.get("message") if isinstance(err, dict) else err
    except BadUpstream:
        words = raw[:300].decode("utf-8", "replace")
    first = str(words or "").strip().splitlines()[0] if str(words or "").strip() else ""
    return ApiError(status, f"the upstream server refused the request ({status}): {first[:500]}",
                    code="upstream_error")


def _no_such_api(upstream: str, path: str, said: ApiError) -> ApiError:
    """An upstream's 404 for a Responses or Messages route: most likely it does not have that API."""
    api = "OpenAI's Responses API" if path == "/responses" else "Anthropic's Messages API"  # or its count_tokens
    return ApiError(404, f"the upstream server {upstream} answered 404 for {path}: it does not seem to have {api} "
                         f"(its words: {said.message.split(': ', 1)[-1] or 'none'}); /v1/chat/completions reaches "
                         "any OpenAI-compatible server", code="upstream_lacks_endpoint")


def _unreachable(upstream: str, e: Exception) -> ApiError:
    return ApiError(502, f"the upstream server {upstream} cannot be reached: {type(e).__name__}: {e}",
                    code="upstream_unreachable")
