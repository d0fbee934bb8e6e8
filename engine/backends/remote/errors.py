"""What can go wrong talking to a server, each as one line a person can act on.

All are `EngineError`s, so the CLI prints them without a traceback and the app
shows them in its error dialog. Messages never contain the API key.
"""

from __future__ import annotations

from engine.errors import EngineError


class ServerError(EngineError):
    """Base class for failures of a remote OpenAI-compatible server."""


class ServerUnreachableError(ServerError):
    """Connection refused, unknown host, TLS failure: nothing answered."""


class ServerAuthError(ServerError):
    """401/403: the API key is missing or wrong."""


class ServerTimeoutError(ServerError):
    """The server did not answer within the timeout the user set."""


class ServerResponseError(ServerError):
    """The server answered with an error status or something that is not the OpenAI API."""


class UnknownServerModelError(ServerError):
    """The `#model` part of the URL names no model the server lists."""


class UnsupportedByServerError(ServerError, ValueError):
    """A setting or feature this server cannot take (refused before anything is sent)."""


class StreamCutError(ServerError):
    """The connection ended in the middle of an answer."""


class RequestCancelledError(ServerError):
    """The user cancelled while a request was in flight (it was abandoned, not waited for)."""
