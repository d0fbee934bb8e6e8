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
