"""`Steering`: which vectors steer an answer, how strongly, over which layers. A frozen value, like SamplerSettings.

It travels on `GenerationRequest.steering` and is recorded with the answer
(`to_dict`: each vector's name, content hash and strength, and the layer
range; never the vectors' numbers). The effect on the model is llama.cpp's
control vector: at every decoder layer `i` in the range, the output gets
`sum(strength_k * vector_k.directions[i])` added, at every position.

The layer range is llama.cpp's `--control-vector-layer-range START END`:
both ends inclusive, None meaning llama.cpp's defaults (from layer 1, to the
last layer). No entries, or only zero strengths, means no steering
(`active` is False) and an answer runs exactly as without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.steering.errors import SteeringError
from engine.steering.shape import ResidualShape
from engine.steering.vector import SteeringVector

STRENGTH_LIMIT = 1000.0  # |strength| above this is a typo, not a setting (the panel's slider spans -2..+2)

SteeringKey = tuple[tuple[tuple[str, float], ...], int | None, int | None]


@dataclass(frozen=True)
class SteeringEntry:
    """One vector at one strength (negative steers the other way)."""

    vector: SteeringVector
    strength: float = 1.0


def _problems(entries: tuple[Any, ...], start: Any, end: Any) -> list[str]:
    errors: list[str] = []
    for e in entries:
        if not isinstance(e, SteeringEntry):
            errors.append(f"each entry must be a SteeringEntry(vector, strength), got {type(e).__name__}")
            continue
        if not isinstance(e.vector, SteeringVector):
            errors.append(f"an entry's vector must be an engine.steering.SteeringVector, got {type(e.vector).__name__}")
            continue
        s = e.strength
        if isinstance(s, bool) or not isinstance(s, (int, float, np.floating, np.integer)) or not math.isfinite(float(s)):
            errors.append(f"the strength of {e.vector.name!r} must be a finite number, got {s!r}")
        elif abs(float(s)) > STRENGTH_LIMIT:
            errors.append(f"the strength of {e.vector.name!r} is {float(s):g}; keep it within ±{STRENGTH_LIMIT:g}")
    vectors = [e.vector for e in entries if isinstance(e, SteeringEntry) and isinstance(e.vector, SteeringVector)]
    if len({(v.n_layer, v.n_embd) for v in vectors}) > 1:
        sizes = ", ".join(f"{v.name!r} {v.n_layer}x{v.n_embd}" for v in vectors)
        errors.append(f"the vectors were made for different models ({sizes}); steer with vectors of one model")
    for name, value in (("layer range start", start), ("layer range end", end)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            errors.append(f"the {name} must be a layer number of 1 or more, got {value!r}")
    if not errors and start is not None and end is not None and start > end:
        errors.append(f"the layer range {start}..{end} is empty: its start is after its end")
    return errors


@dataclass(frozen=True)
class Steering:
    """Vectors with a strength each, and the layers they act on (both ends inclusive; None: llama.cpp's defaults).

    Build it with `Steering.of((vector, strength), ...)` or `Steering(entries=(SteeringEntry(v, s), ...))`.
    It checks itself when made and raises one `SteeringError` naming every problem (a strength that is not a
    finite number, vectors of different models, a range that is empty). Fit to a particular model is checked
    by `check_for(shape)` when it is applied, before anything runs.
    """

    entries: tuple[SteeringEntry, ...] = ()
    layer_start: int | None = None
    layer_end: int | None = None

    def __post_init__(self) -> None:
        entries = self.entries
        if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Iterable):
            raise SteeringError(f"entries must be a list of SteeringEntry, got {type(entries).__name__}")
        entries = tuple(entries)
        object.__setattr__(self, "entries", entries)
        errors = _problems(entries, self.layer_start, self.layer_end)
        if errors:
            raise SteeringError("invalid steering: " + "; ".join(errors))
        object.__setattr__(self, "entries", tuple(SteeringEntry(e.vector, float(e.strength)) for e in entries))
        for name in ("layer_start", "layer_end"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, int(value))

    @classmethod
    def of(cls, *pairs: tuple[SteeringVector, float], layer_start: int | None = None,
           layer_end: int | None = None) -> "Steering":
        """`Steering.of((happy, 0.8), (formal, -0.5), layer_start=5)`."""
        return cls(tuple(SteeringEntry(v, s) for v, s in pairs), layer_start, layer_end)

    @property
    def active(self) -> bool:
        """True when it changes anything: some vector at a non-zero strength."""
        return any(e.strength != 0 for e in self.entries)

    @property
    def vectors(self) -> tuple[SteeringVector, ...]:
        return tuple(e.vector for e in self.entries)

    def with_strength(self, name: str, strength: float) -> "Steering":
        """A copy with vector `name`'s strength changed (SteeringError when no entry has that name)."""
        if name not in {e.vector.name for e in self.entries}:
            raise SteeringError(f"no steering vector named {name!r}; there are {[e.vector.name for e in self.entries]}")
        return Steering(tuple(SteeringEntry(e.vector, strength) if e.vector.name == name else e for e in self.entries),
                        self.layer_start, self.layer_end)

    def with_layers(self, start: int | None, end: int | None) -> "Steering":
        return Steering(self.entries, start, end)

    def key(self) -> SteeringKey | None:
        """What decides the model's numbers: equal keys, equal steered forwards. None when not active.

        A backend keeps the key its KV cache was computed under and drops the cache when it changes
        (a steered prefix's keys and values are not an unsteered one's)."""
        if not self.active:
            return None
        parts = tuple((e.vector.digest, e.strength) for e in self.entries if e.strength != 0)
        return parts, self.layer_start, self.layer_end

    def layer_range(self, n_layer: int) -> tuple[int, int]:
        """(first, last) layer steered in a model of `n_layer` layers, both inclusive, as llama.cpp clamps them."""
        start = 1 if self.layer_start is None else self.layer_start
        end = n_layer - 1 if self.layer_end is None else min(self.layer_end, n_layer - 1)
        return start, end

    def check_for(self, model: ResidualShape, model_name: str = "this model") -> None:
        """SteeringError in words unless every vector fits `model` and the range holds one of its layers."""
        for e in self.entries:
            e.vector.check_for(model, model_name)
        start, end = self.layer_range(model.n_layer)
        if start > end:
            raise SteeringError(
                f"the layer range {self.layer_start}..{self.layer_end} holds none of {model_name}'s layers "
                f"1..{model.n_layer - 1} that can be steered"
            )

    def combined(self, model: ResidualShape) -> np.ndarray:
        """(n_layer, n_embd) float32: what is added to each layer's output (zero outside the range and at layer 0).

        Checks fit first (`check_for`), so nothing is applied from a vector for another model."""
        self.check_for(model)
        out = np.zeros((model.n_layer, model.n_embd), dtype=np.float32)
        for e in self.entries:
            if e.strength != 0:
                out += np.float32(e.strength) * e.vector.directions
        start, end = self.layer_range(model.n_layer)
        out[:start] = 0
        out[end + 1 :] = 0
        return out

    def describe(self) -> str:
        """One line for people: "happy ×0.8, formal ×-0.5 (layers 5..20)"; "no steering" when not active."""
        if not self.active:
            return "no steering"
        parts = ", ".join(f"{e.vector.name} ×{e.strength:g}" for e in self.entries if e.strength != 0)
        if self.layer_start is None and self.layer_end is None:
            return parts
        start = self.layer_start if self.layer_start is not None else 1
        end = self.layer_end if self.layer_end is not None else "last"
        return f"{parts} (layers {start}..{end})"

    def to_dict(self) -> dict[str, Any]:
        """The record kept with an answer: each vector's name, content hash, model facts and strength, the range."""
        return {
            "vectors": [{**e.vector.record(), "strength": e.strength} for e in self.entries],
            "layer_start": self.layer_start,
            "layer_end": self.layer_end,
        }

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], vectors: Mapping[str, SteeringVector] | Callable[[str], SteeringVector | None]
    ) -> "Steering":
        """A `to_dict` record back, its vectors found by content hash in `vectors` ({sha256: vector} or a lookup).

        SteeringError naming the vector when one is not available (replaying needs the same numbers)."""
        if not isinstance(d, Mapping):
            raise SteeringError(f"a steering record must be a mapping, got {type(d).__name__}")
        find = vectors if callable(vectors) else vectors.get
        rows = d.get("vectors", [])
        if not isinstance(rows, list):
            raise SteeringError(f"a steering record's vectors must be a list, got {type(rows).__name__}")
        entries = []
        for row in rows:
            if not isinstance(row, Mapping) or not isinstance(row.get("sha256"), str):
                raise SteeringError(f"a steering record's vector needs its name and sha256, got {row!r}")
            vector = find(row["sha256"])
            if vector is None:
                raise SteeringError(
                    f"steering vector {row.get('name')!r} (sha256 {row['sha256']}) is not loaded; load that "
                    "vector to run with this steering again"
                )
            entries.append(SteeringEntry(vector, row.get("strength", 1.0)))
        return cls(tuple(entries), d.get("layer_start"), d.get("layer_end"))


NO_STEERING = Steering()


def key_of(steering: Steering | None) -> SteeringKey | None:
    """The cache identity of a request's steering; None for none (so None and an inactive Steering agree)."""
    return None if steering is None else steering.key()
