"""Bringing a request's steering to the backend before its first forward (the decode loop and the worker call it)."""

from __future__ import annotations

from engine.capabilities import Steerable, require
from engine.steering.settings import Steering


def steer_for_request(backend: object, steering: Steering | None) -> None:
    """Make `backend` run under `steering` (None or inactive: unsteered) from its next forward on.

    An active steering on a model that cannot steer (a server) is refused in words (MissingCapabilityError),
    and a vector for another model (SteeringError), before anything runs. A steerable backend asked for no
    steering drops any it had, so one answer's steering never leaks into the next.
    """
    if steering is not None and steering.active:
        require(backend, Steerable, "steering (control vectors)").set_steering(steering)
    elif isinstance(backend, Steerable):
        backend.set_steering(None)


def can_steer(backend: object) -> bool:
    """Whether the loaded model can be steered (for enabling the window's Steering panel)."""
    return isinstance(backend, Steerable)
