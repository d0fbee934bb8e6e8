"""The ASGI app: routes, the API key, and OpenAI-shaped errors for everything that goes wrong.

Routes (each also without the `/v1` prefix, as llama.cpp's server has them):
`GET /health`, `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`, and llama.cpp's
`POST /tokenize` {"content", "add_special", "with_pieces"}, `POST /detokenize` {"tokens"}, `GET /props`.
Every route but `/health` needs the API key when one is set (`Authorization: Bearer KEY`).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.serve.body import read_json
from engine.serve.errors import ApiError

log = logging.getLogger(__name__)


class Service(Protocol):
    """What the routes need: the engine's service or the proxy's."""

    model_name: str

    async def answer(self, endpoint: Any, body: dict[str, Any], request: Request) -> Response: ...

    async def models(self) -> dict[str, Any]: ...

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def props(self) -> dict[str, Any]: ...


def build_app(service: Service, api_key: str | None = None) -> Starlette:
    """The server's app over `service`; `api_key` (None: none needed) guards every route but /health."""

    def authorized(request: Request) -> None:
        if not api_key:
            return
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(token.encode("utf-8", "replace"), api_key.encode("utf-8")):
            raise ApiError(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    def guarded(handler):  # type: ignore[no-untyped-def]
        async def endpoint(request: Request) -> Response:
            try:
                authorized(request)
                return await handler(request)
            except ApiError as e:
                return e.response()
            except RecursionError:
                return ApiError(400, "the request is nested too deeply to read", code="invalid_json").response()
            except Exception as e:  # noqa: BLE001 - a bug: answered in words, logged with its traceback
                log.exception("the server failed on %s", request.url.path)
                return ApiError(500, f"the server failed: {type(e).__name__}: {e}").response()
        return endpoint

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        return JSONResponse(await service.models())

    async def chat(request: Request) -> Response:
        return await service.answer("chat.completions", await read_json(request), request)

    async def completions(request: Request) -> Response:
        return await service.answer("completions", await read_json(request), request)

    async def tokenize(request: Request) -> Response:
        return JSONResponse(await service.tokenize(await read_json(request)))

    async def detokenize(request: Request) -> Response:
        return JSONResponse(await service.detokenize(await read_json(request)))

    async def props(request: Request) -> Response:
        return JSONResponse(await service.props())

    routes = [Route("/health", health, methods=["GET"])]
    for prefix in ("/v1", ""):
        routes += [Route(f"{prefix}/models", guarded(models), methods=["GET"]),
                   Route(f"{prefix}/chat/completions", guarded(chat), methods=["POST"]),
                   Route(f"{prefix}/completions", guarded(completions), methods=["POST"])]
    routes += [Route("/tokenize", guarded(tokenize), methods=["POST"]),
               Route("/detokenize", guarded(detokenize), methods=["POST"]),
               Route("/props", guarded(props), methods=["GET"])]

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            return ApiError(404, f"there is no {request.url.path} here; see GET /v1/models, POST /v1/chat/completions "
                                 "and POST /v1/completions", code="unknown_url").response()
        if status == 405:
            return ApiError(405, f"{request.method} is not allowed on {request.url.path}",
                            code="method_not_allowed").response()
        return ApiError(status, str(getattr(exc, "detail", exc))).response()

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
