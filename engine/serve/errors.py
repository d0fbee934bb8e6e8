"""Errors as OpenAI's API writes them: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

The `openai` client turns the status into its exception (400 BadRequestError, 401 AuthenticationError,
404 NotFoundError, 413/503 APIStatusError...) and shows `message`, so the message is one line a user can act on.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from engine.errors import ContextLengthError

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          503: "server_error", 500: "server_error"}


class SafeJSONResponse(JSONResponse):
    """JSON that is always sent: a string that is not text (a lone surrogate from a client's JSON, echoed in a
    message) is written as its \\u escape instead of failing the response with a plain-text 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class ApiError(Exception):
    """A request the server answers with an error document instead of an answer."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.close = close  # end the connection after the answer (a body that did not come: the rest may follow)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.close:
            headers["Connection"] = "close"
        return SafeJSONResponse(self.body(), status_code=self.status, headers=headers or None)


def bad_field(param: str, message: str) -> ApiError:
    """A 400 naming the field that is wrong."""
    return ApiError(400, message, param=param, code="invalid_value")


def refused(param: str, message: str) -> ApiError:
    """A 400 for a field this server understands but cannot honour (never silently ignored)."""
    return ApiError(400, message, param=param, code="unsupported_parameter")


def engine_error(e: BaseException) -> ApiError:
    """The engine's error as a client is told it (a context overflow, a bad value: 400; else 500)."""
    if isinstance(e, ContextLengthError):
        return ApiError(400, str(e), param="max_tokens", code="context_length_exceeded")
    if isinstance(e, (ValueError, TypeError)):
        return ApiError(400, str(e), code="invalid_value")
    return ApiError(500, str(e), code="model_error")
