"""Proxy mode: each request goes to another OpenAI-compatible server, and its answer is recorded like ours.

The client's body is forwarded as it is, with one change: the upstream is asked for log-probs (the chosen
token's and its top `min(options.top_n, UPSTREAM_TOP)` alternatives) so the record has them; what the client
did not ask for is taken out of the answer again before it reaches the client (and alternatives beyond the
number it asked for). An upstream that refuses the log-probs request (4xx) is asked again with the client's
own body, and the record then has the tokens' text only. The upstream's errors reach the client with the
upstream's status and words. Nothing but the configured upstream is ever contacted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.backends.remote.errors import ServerError
from engine.events import FinishReason
from engine.serve import fields as f
from engine.serve.errors import ApiError
from engine.serve.exchange import Endpoint, ServedChoice, ServedExchange, Sinks
from engine.serve.limits import MAX_N
from engine.serve.parse import read_sampler
from engine.serve.proxy_events import UpstreamChoice
from engine.serve.service import ServeOptions, client_address, dumps

log = logging.getLogger(__name__)

UPSTREAM_TOP = 20  # alternatives asked of the upstream per token: OpenAI's chat ceiling, which servers copy
_PATHS = {"chat.completions": "/chat/completions", "completions": "/completions"}


class _Answer:
    """A proxied answer under way: what stopping it needs."""

    def __init__(self, exchange: ServedExchange, n: int) -> None:
        self.exchange = exchange
        self.choices = [UpstreamChoice() for _ in range(n)]
        self.response: httpx.Response | None = None
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        if self.response is not None:
            asyncio.ensure_future(self.response.aclose())  # the read in progress ends; the upstream stops


class ProxyService:
    """Answers by forwarding to `upstream` (a base URL, usually ending in /v1)."""

    def __init__(self, upstream: str, sinks: Sinks, options: ServeOptions = ServeOptions(),
                 api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.sinks = sinks
        self.options = options
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                      follow_redirects=False)
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

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            response = await self.http.get(url)
        except httpx.HTTPError as e:
            raise _unreachable(self.upstream, e) from None
        return _json_or_error(response)

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self.http.post(url, json=body)
        except httpx.HTTPError as e:
            raise _unreachable(self.upstream, e) from None
        return _json_or_error(response)

    def _root(self) -> str:
        return self.upstream[: -len("/v1")] if self.upstream.endswith("/v1") else self.upstream

    async def models(self) -> dict[str, Any]:
        return await self._get(self.upstream + "/models")

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post(self._root() + "/tokenize", body)

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post(self._root() + "/detokenize", body)

    async def props(self) -> dict[str, Any]:
        return await self._get(self._root() + "/props")

    # --- answers -------------------------------------------------------------------------------------------

    async def answer(self, endpoint: Endpoint, body: dict[str, Any], request: Request) -> Response:
        n = f.whole(body, "n", 1, MAX_N, 1) or 1
        stream = f.flag(body, "stream")
        model = f.text(body, "model") or ""
        chat = endpoint == "chat.completions"
        asked_top = _asked_top(body, chat)
        forwarded = _with_logprobs(body, chat, min(self.options.top_n, UPSTREAM_TOP))
        try:
            sampler = read_sampler(body)
        except ApiError:
            sampler = None  # fields the upstream may know and we do not: the record has no settings
        answer_id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        messages = tuple(body["messages"]) if chat and isinstance(body.get("messages"), list) else None
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else None
        exchange = ServedExchange(
            id=answer_id, endpoint=endpoint, model=model, client=client_address(request), proxied=True,
            upstream=self.upstream, messages=messages, prompt=prompt, prompt_ids=(), sampler=sampler, request=None,
            n=n, stream=stream, body=body,
        )
        url = self.upstream + _PATHS[endpoint]
        response = await self._open(url, forwarded, body, stream)
        answer = _Answer(exchange, n)
        answer.response = response
        self.active[answer_id] = answer
        self.sinks.on_start(exchange)
        seed = body.get("seed") if isinstance(body.get("seed"), int) else None
        t0 = time.perf_counter()
        if stream:
            return EventSourceResponse(self._stream(answer, response, asked_top, seed, t0), ping=15)
        try:
            doc = json.loads(await response.aread())
        except (httpx.HTTPError, ValueError) as e:
            if answer.stopped:  # Stop while the upstream was still working on a whole answer: nothing to show yet
                self._end(answer, t0, seed, 0)
                raise ApiError(503, "the answer was stopped on this server before the upstream finished it",
                               code="stopped") from None
            self._end(answer, t0, seed, 0, error=f"the upstream's answer could not be read: {e}")
            raise ApiError(502, f"{self.upstream} answered with something that is not JSON", code="bad_upstream") from None
        finally:
            await response.aclose()
        prompt_tokens = _prompt_tokens(doc)
        for i, choice in enumerate(doc.get("choices") or []):
            if isinstance(choice, dict) and 0 <= int(choice.get("index", i)) < n:
                try:
                    answer.choices[int(choice.get("index", i))].feed(choice, whole=True)
                except ServerError as e:
                    log.warning("the upstream's log-probs could not be read: %s", e)
                _trim_logprobs(choice, asked_top, chat)
        self._end(answer, t0, seed, prompt_tokens)
        return JSONResponse(doc)

    async def _open(self, url: str, forwarded: dict[str, Any], body: dict[str, Any], stream: bool) -> httpx.Response:
        """The upstream's response, headers read; its error, with its status, when it refused."""
        for attempt, payload in enumerate((forwarded, body)):
            try:
                response = await self.http.send(self.http.build_request("POST", url, json=payload), stream=True)
            except httpx.HTTPError as e:
                raise _unreachable(self.upstream, e) from None
            if response.status_code < 400:
                return response
            raw = await response.aread()
            await response.aclose()
            if 400 <= response.status_code < 500 and attempt == 0 and forwarded is not body:
                log.info("%s refused the request with log-probs (%d); forwarding it as the client sent it",
                         self.upstream, response.status_code)
                continue
            raise _upstream_error(self.upstream, response.status_code, raw)
        raise AssertionError("unreachable")

    async def _stream(self, answer: _Answer, response: httpx.Response, asked_top: int | None, seed: int | None,
                      t0: float) -> AsyncIterator[str]:
        chat = answer.exchange.endpoint == "chat.completions"
        prompt_tokens = 0
        ended = False
        try:
            try:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    prompt_tokens = _prompt_tokens(chunk) or prompt_tokens
                    for choice in chunk.get("choices") or []:
                        i = choice.get("index", 0) if isinstance(choice, dict) else -1
                        if isinstance(i, int) and 0 <= i < len(answer.choices):
                            for event in answer.choices[i].feed(choice):
                                self.sinks.on_token(answer.exchange.id, i, event)
                            _trim_logprobs(choice, asked_top, chat)
                    yield dumps(chunk)
            except (httpx.HTTPError, ValueError, ServerError) as e:
                if not answer.stopped:
                    ended = True
                    self._end(answer, t0, seed, prompt_tokens, error=f"the upstream's stream failed: {e}")
                    yield dumps(ApiError(502, f"{self.upstream}'s stream failed: {e}", code="bad_upstream").body())
                    yield "[DONE]"
                    return
            if answer.stopped:  # the window's Stop: the client's stream ends like a finished answer
                for i, c in enumerate(answer.choices):
                    if c.finish is None:
                        yield dumps(_stop_chunk(answer.exchange, i, chat))
            ended = True
            self._end(answer, t0, seed, prompt_tokens)
            yield "[DONE]"
        finally:
            await response.aclose()
            if not ended:
                self._end(answer, t0, seed, prompt_tokens, disconnected=True)

    def _end(self, answer: _Answer, t0: float, seed: int | None, prompt_tokens: int, *, error: str | None = None,
             disconnected: bool = False) -> None:
        if self.active.pop(answer.exchange.id, None) is None:
            return
        ended: FinishReason | None = "cancelled" if (answer.stopped or disconnected) else ("error" if error else None)
        choices = []
        for i, c in enumerate(answer.choices):
            stats = c.stats(t0, prompt_tokens, seed, ended if c.finish is None or error else None, error)
            if error:
                reason = "error"
            elif c.finish is None:
                reason = "cancelled" if disconnected else "stop"  # gone before the end; or the window's Stop
            else:
                reason = c.finish
            choices.append(ServedChoice(i, tuple(c.events), stats, reason))
        answer.exchange = dataclasses.replace(answer.exchange, finished_at=time.time(), choices=tuple(choices),
                                              error=error, stopped=answer.stopped, disconnected=disconnected)
        self.sinks.on_end(answer.exchange)


def _asked_top(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives the client asked for (None: no log-probs at all)."""
    if chat:
        if body.get("logprobs") is not True:
            return None
        top = body.get("top_logprobs")
        return top if isinstance(top, int) and not isinstance(top, bool) else 0
    top = body.get("logprobs")
    return top if isinstance(top, int) and not isinstance(top, bool) else None


def _with_logprobs(body: dict[str, Any], chat: bool, top: int) -> dict[str, Any]:
    asked = _asked_top(body, chat)
    if asked is not None and asked >= top:
        return body
    if chat:
        return {**body, "logprobs": True, "top_logprobs": max(top, asked or 0)}
    return {**body, "logprobs": max(top, asked or 0)}


def _trim_logprobs(choice: dict[str, Any], asked_top: int | None, chat: bool) -> None:
    """Take out of a choice the log-probs the client did not ask for (in place)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return
    if asked_top is None:
        choice["logprobs"] = None
        return
    for entry in lp.get("content") or []:
        if isinstance(entry, dict) and isinstance(entry.get("top_logprobs"), list):
            entry["top_logprobs"] = entry["top_logprobs"][:asked_top]
    if isinstance(lp.get("top_logprobs"), list):
        lp["top_logprobs"] = [dict(list(t.items())[:asked_top]) if isinstance(t, dict) else t
                              for t in lp["top_logprobs"]]


def _stop_chunk(exchange: ServedExchange, index: int, chat: bool) -> dict[str, Any]:
    if chat:
        choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    else:
        choice = {"index": index, "text": "", "logprobs": None, "finish_reason": "stop"}
    return {"id": exchange.id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(exchange.started_at), "model": exchange.model, "choices": [choice]}


def _prompt_tokens(doc: Any) -> int:
    usage = doc.get("usage") if isinstance(doc, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _json_or_error(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise _upstream_error(str(response.url.copy_with(path="/")), response.status_code, response.content)
    try:
        doc = response.json()
    except ValueError:
        raise ApiError(502, f"{response.url} answered with something that is not JSON", code="bad_upstream") from None
    if not isinstance(doc, dict):
        raise ApiError(502, f"{response.url} answered with JSON that is not an object", code="bad_upstream")
    return doc


def _upstream_error(upstream: str, status: int, raw: bytes) -> ApiError:
    """The upstream's refusal, passed on with its status and its words."""
    try:
        doc = json.loads(raw)
        err = doc.get("error", doc.get("detail")) if isinstance(doc, dict) else None
        words = err.get("message") if isinstance(err, dict) else err
    except ValueError:
        words = raw[:300].decode("utf-8", "replace")
    first = str(words or "").strip().splitlines()[0] if str(words or "").strip() else ""
    return ApiError(status, f"the upstream server refused the request ({status}): {first[:500]}",
                    code="upstream_error")


def _unreachable(upstream: str, e: Exception) -> ApiError:
    return ApiError(502, f"the upstream server {upstream} cannot be reached: {type(e).__name__}: {e}",
                    code="upstream_unreachable")
