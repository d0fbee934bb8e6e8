"""Sampler settings: one frozen value object, validated on construction.

The settings say *what* the chain does; `engine.sampling.chain` says *how*.
Keeping them apart lets the app store, diff and show settings without numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

# Every stage the chain knows, in the default order. Filters run on the
# model's own distribution and temperature reshapes only the survivors last
# (llama.cpp / mlx-lm order), so what a filter cut is what the model said,
# not an artefact of the temperature. The order is a parameter.
STAGE_NAMES: tuple[str, ...] = (
    "penalties",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "xtc",
    "temperature",
)
DEFAULT_ORDER: tuple[str, ...] = STAGE_NAMES


@dataclass(frozen=True)
class SamplerSettings:
    """How the next token is chosen from the model's logits.

    A value that switches a stage off is its neutral value: temperature 1,
    top_k 0, top_p 1, min_p 0, typical_p 1, penalties 1/0/0, xtc_probability 0.
    `temperature == 0` means greedy (argmax after the other stages).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # how many recent tokens the penalties look at; -1 = all
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    seed: int | None = None
    order: tuple[str, ...] = field(default=DEFAULT_ORDER)

    def __post_init__(self) -> None:
        # Lists from JSON / argparse become tuples so the value stays hashable.
        object.__setattr__(self, "order", tuple(self.order))
        errors = validate(self)
        if errors:
            raise ValueError("invalid sampler settings: " + "; ".join(errors))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes: Any) -> "SamplerSettings":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["order"] = list(self.order)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SamplerSettings":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampler settings: {', '.join(sorted(unknown))}")
        return cls(**d)


def _finite(name: str, v: Any, errors: list[str]) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        errors.append(f"{name} must be a finite number, got {v!r}")
        return False
    return True


def _integer(name: str, v: Any, errors: list[str]) -> bool:
    if isinstance(v, bool) or not isinstance(v, int):
        errors.append(f"{name} must be an integer, got {v!r}")
        return False
    return True


def validate(s: SamplerSettings) -> list[str]:
    """Every problem with `s`, as messages a user can act on (empty if fine)."""
    e: list[str] = []
    if _finite("temperature", s.temperature, e) and s.temperature < 0:
        e.append(f"temperature must be >= 0 (0 = greedy), got {s.temperature}")
    if _integer("top_k", s.top_k, e) and s.top_k < 0:
        e.append(f"top_k must be >= 0 (0 = off), got {s.top_k}")
    if _finite("top_p", s.top_p, e) and not 0 < s.top_p <= 1:
        e.append(f"top_p must be in (0, 1], got {s.top_p}")
    if _finite("min_p", s.min_p, e) and not 0 <= s.min_p <= 1:
        e.append(f"min_p must be in [0, 1], got {s.min_p}")
    if _finite("typical_p", s.typical_p, e) and not 0 < s.typical_p <= 1:
        e.append(f"typical_p must be in (0, 1], got {s.typical_p}")
    if _finite("repetition_penalty", s.repetition_penalty, e) and s.repetition_penalty <= 0:
        e.append(f"repetition_penalty must be > 0 (1 = off), got {s.repetition_penalty}")
    if _finite("presence_penalty", s.presence_penalty, e) and not -2 <= s.presence_penalty <= 2:
        e.append(f"presence_penalty must be in [-2, 2], got {s.presence_penalty}")
    if _finite("frequency_penalty", s.frequency_penalty, e) and not -2 <= s.frequency_penalty <= 2:
        e.append(f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}")
    if _integer("penalty_last_n", s.penalty_last_n, e) and s.penalty_last_n < -1:
        e.append(f"penalty_last_n must be >= -1 (-1 = whole history), got {s.penalty_last_n}")
    if _finite("xtc_probability", s.xtc_probability, e) and not 0 <= s.xtc_probability <= 1:
        e.append(f"xtc_probability must be in [0, 1], got {s.xtc_probability}")
    if _finite("xtc_threshold", s.xtc_threshold, e) and not 0 < s.xtc_threshold <= 0.5:
        e.append(f"xtc_threshold must be in (0, 0.5], got {s.xtc_threshold}")
    if s.seed is not None and _integer("seed", s.seed, e) and not 0 <= s.seed < 2**63:
        e.append(f"seed must be in [0, 2**63), got {s.seed}")
    unknown = [n for n in s.order if n not in STAGE_NAMES]
    if unknown:
        e.append(f"unknown sampler stages {unknown}; known: {', '.join(STAGE_NAMES)}")
    if len(set(s.order)) != len(s.order):
        e.append(f"sampler stage order names a stage twice: {list(s.order)}")
    return e
