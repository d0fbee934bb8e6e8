"""Errors meant to be read by a person: each message says what and why.

The CLI prints `EngineError` messages on one line without a traceback; the app
shows them in a dialog. Anything else escaping the engine is a bug.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class for failures the user can act on."""


class ModelNotFoundError(EngineError):
    """The model spec names nothing that exists (path, package or hub id)."""


class ModelLoadError(EngineError):
    """The model exists but could not be read (corrupt file, unsupported architecture)."""


class HubUnreachableError(EngineError):
    """A hub id was given but the hub cannot be reached and no local copy exists."""


class ContextLengthError(EngineError, ValueError):
    """Prompt plus requested new tokens do not fit the model's context."""


class GenerationCancelled(EngineError):
    """Raised on the consumer side when a request was cancelled before it started."""


class UsageError(EngineError, ValueError):
    """A value or path the user gave (a command-line option, a prompt file) cannot be used as given."""


class RemoteCodeRefusedError(ModelLoadError):
    """The model folder ships Python code of its own (`auto_map`) and running it was not allowed.

    `files` names the code files the model asks to run, so a front end can show
    them before the user allows it (`--trust-remote-code`, the app's confirmation).
    """

    def __init__(self, message: str, files: tuple[str, ...] = ()):
        super().__init__(message)
        self.files = files


class TokenIdError(EngineError, ValueError):
    """A token id (from a file, the API, a server or step mode) is not in the model's vocabulary."""
