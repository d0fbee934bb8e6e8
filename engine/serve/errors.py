"""Errors as OpenAI's API writes them: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

The `openai` client turns the status into its exception (400 BadRequestError, 401 AuthenticationError,
404 NotFoundError, 413/503 APIStatusError...) and shows `message`, so the message is one line a user can act on.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "server_error", 500: "server_error"}


class ApiError(Exception):
    """A request the server answers with an error document instead of an answer."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_field(param: str, message: str) -> ApiError:
    """A 400 naming the field that is wrong."""
    return ApiError(400, message, param=param, code="invalid_value")


def refused(param: str, message: str) -> ApiError:
    """A 400 for a field this server understands but cannot honour (never silently ignored)."""
    return ApiError(400, message, param=param, code="unsupported_parameter")
