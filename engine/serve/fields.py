"""Typed readers for request fields: each returns the value or raises a 400 naming the field and what it wants.

`null` is read as "not given" everywhere (clients send it for options they leave at the default).
"""

from __future__ import annotations

import math
from typing import Any

from engine.serve.errors import bad_field


def whole(body: dict[str, Any], name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(name, f"{name} must be a whole number from {lo:,} to {hi:,}, got {_show(value)}")
    if not lo <= value <= hi:
        raise bad_field(name, f"{name} must be from {lo:,} to {hi:,}, got {value:,}")
    return value


def flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_field(name, f"{name} must be true or false, got {_show(value)}")
    return value


def text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_field(name, f"{name} must be a string, got {_show(value)}")
    return value


def obj(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise bad_field(name, f"{name} must be a JSON object, got {_show(value)}")
    return value


def finite_numbers(body: dict[str, Any], names: set[str]) -> None:
    """Every number among `names` is finite (1e999 reads as infinity in JSON)."""
    for name in names:
        value = body.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            raise bad_field(name, f"{name} must be a finite number, got {value}")


def _show(value: Any) -> str:
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} ({shown[:40]}{'...' if len(shown) > 40 else ''})"
