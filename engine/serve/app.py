"""The ASGI app: routes, the API key, and OpenAI-shaped errors for everything that goes wrong.

Routes (each also without the `/v1` prefix, as llama.cpp's server has them):
`GET /health`, `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`
(OpenAI's Responses API, engine.serve.responses_api), `POST /v1/messages` and `/v1/messages/count_tokens`
(Anthropic's Messages API, engine.serve.anthropic_api; its errors in Anthropic's shape), and llama.cpp's
`POST /tokenize` {"content", "add_special", "with_pieces"}, `POST /detokenize` {"tokens"}, `GET /props`.
Every route but `/health` needs the API key when one is set (`Authorization: Bearer KEY`, or `x-api-key: KEY`
as Anthropic's clients send it). A path with a trailing slash is the same route (served, after the key check; never redirected).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.serve.anthropic_api import AnthropicApi
from engine.serve.anthropic_shape import error_response as anthropic_error
from engine.serve.body import read_json as read_body_json
from engine.serve.errors import ApiError
from engine.serve.limits import BODY_TIMEOUT_S
from engine.serve.responses_api import ResponsesApi

log = logging.getLogger(__name__)


class Service(Protocol):
    """What the routes need: the engine's service or the proxy's."""

    model_name: str

    async def answer(self, endpoint: Any, body: dict[str, Any], request: Request) -> Response: ...

    async def models(self) -> dict[str, Any]: ...

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def props(self) -> dict[str, Any]: ...


def build_app(service: Service, api_key: str | None = None, *,
              body_timeout_s: float | None = BODY_TIMEOUT_S) -> Starlette:
    """The server's app over `service`; `api_key` (None: none needed) guards every route but /health; a body
    that has not all come `body_timeout_s` after its headers is a 408."""

    async def read_json(request: Request) -> dict[str, Any]:
        return await read_body_json(request, timeout=body_timeout_s)

    def guarded(handler: Handler, render: Callable[[ApiError], Response] = ApiError.response) -> Handler:
        return _guarded(handler, api_key, render)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        return JSONResponse(await service.models())

    async def chat(request: Request) -> Response:
        return await service.answer("chat.completions", await read_json(request), request)

    async def completions(request: Request) -> Response:
        return await service.answer("completions", await read_json(request), request)

    responses_api, anthropic_api = ResponsesApi(service), AnthropicApi(service)

    async def responses(request: Request) -> Response:
        return await responses_api.answer(await read_json(request), request)

    async def messages(request: Request) -> Response:
        return await anthropic_api.answer(await read_json(request), request)

    async def count_tokens(request: Request) -> Response:
        return await anthropic_api.count_tokens(await read_json(request))

    async def tokenize(request: Request) -> Response:
        return JSONResponse(await service.tokenize(await read_json(request)))

    async def detokenize(request: Request) -> Response:
        return JSONResponse(await service.detokenize(await read_json(request)))

    async def props(request: Request) -> Response:
        return JSONResponse(await service.props())

    async def tokenizer_info(request: Request) -> Response:  # vLLM's; lm-eval's remote tokenizer looks for it
        info = getattr(service, "tokenizer_info", None)  # the engine's service has it; proxy mode does not
        if info is None:
            raise ApiError(404, "proxy mode has no /tokenizer_info: ask the upstream", code="unknown_url")
        return JSONResponse(await info())

    routes = [Route("/health", health, methods=["GET"])]
    for prefix in ("/v1", ""):
        routes += [Route(f"{prefix}/models", guarded(models), methods=["GET"]),
                   Route(f"{prefix}/chat/completions", guarded(chat), methods=["POST"]),
                   Route(f"{prefix}/completions", guarded(completions), methods=["POST"]),
                   Route(f"{prefix}/responses", guarded(responses), methods=["POST"]),
                   Route(f"{prefix}/messages", guarded(messages, anthropic_error), methods=["POST"]),
                   Route(f"{prefix}/messages/count_tokens", guarded(count_tokens, anthropic_error), methods=["POST"])]
    routes += [Route("/tokenize", guarded(tokenize), methods=["POST"]),
               Route("/detokenize", guarded(detokenize), methods=["POST"]),
               Route("/props", guarded(props), methods=["GET"]),
               Route("/tokenizer_info", guarded(tokenizer_info), methods=["GET"])]

    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error},
                    middleware=[Middleware(OneSlashForm)])
    # Starlette would answer `/v1/models/` with a 307 to a Location built from the client's Host header, before
    # any key is checked; the slash form is served instead (OneSlashForm), after the key check like any route.
    app.router.redirect_slashes = False
    return app


Handler = Callable[[Request], Awaitable[Response]]


def _check_key(request: Request, api_key: str | None) -> None:
    """An ApiError 401 unless the request sends `api_key` (as a Bearer token or x-api-key); None: none needed."""
    if not api_key:
        return
    given = request.headers.get("authorization", "")
    token = given[7:].strip() if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    if not hmac.compare_digest(token.encode("utf-8", "replace"), api_key.encode("utf-8")):
        raise ApiError(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY' (or x-api-key)",
                       code="invalid_api_key")


def _guarded(handler: Handler, api_key: str | None, render: Callable[[ApiError], Response]) -> Handler:
    """`handler` behind the key check, every failure answered in words in the route's API's shape (`render`:
    OpenAI's; Anthropic's for /v1/messages), a bug logged with its traceback."""
    async def endpoint(request: Request) -> Response:
        try:
            _check_key(request, api_key)
            return await handler(request)
        except ApiError as e:
            return render(e)
        except RecursionError:
            return render(ApiError(400, "the request is nested too deeply to read", code="invalid_json"))
        except Exception as e:  # noqa: BLE001 - a bug: answered in words, logged with its traceback
            log.exception("the server failed on %s", request.url.path)
            return render(ApiError(500, f"the server failed: {type(e).__name__}: {e}"))
    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404s and 405s (and any other HTTPException) in OpenAI's error shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        return ApiError(404, f"there is no {request.url.path} here; see GET /v1/models, POST /v1/chat/completions "
                             "and POST /v1/completions", code="unknown_url").response()
    if status == 405:
        return ApiError(405, f"{request.method} is not allowed on {request.url.path}",
                        code="method_not_allowed").response()
    return ApiError(status, str(getattr(exc, "detail", exc))).response()


class OneSlashForm:
    """`/v1/models/` is `/v1/models`: a trailing slash is dropped before routing (never a redirect)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = dict(scope, path=path.rstrip("/") or "/")
            raw = scope.get("raw_path")
            if isinstance(raw, bytes):
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)
