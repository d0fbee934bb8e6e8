"""The one error steering raises for anything a user gave it: a file, a strength, a range, a pair file."""

from __future__ import annotations

from engine.errors import EngineError


class SteeringError(EngineError, ValueError):
    """A steering vector, setting or pair file that cannot be used; the message says why in one line."""
