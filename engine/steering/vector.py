"""`SteeringVector`: one direction per decoder layer, the thing a control-vector file holds.

Layers are numbered as llama.cpp numbers them (and repeng, and transformers'
`model.layers[i]`): row `i` of `directions` is added to the *output* of
decoder layer `i` (llama.cpp's `l_out-i`), at every position, times the
strength the user chose. Row 0 is always zero: llama.cpp's control vectors
start at layer 1 (`llama_set_adapter_cvec`'s buffer "starts from layer 1",
and its files have no `direction.0`), so a vector that could not be written
to a file or run on llama.cpp is refused here rather than later.

A vector is identified in records by its name and a content hash
(`digest`), never by its numbers: an answer's record says
"happy (sha256 3f2a…) ×0.8", not megabytes of floats.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.steering.errors import SteeringError
from engine.steering.shape import ResidualShape

DIGEST_CHARS = 16  # hex characters of sha256 kept as a vector's identity in records (64 bits)
# The largest value a direction may hold. Trained directions are unit length (every value within ±1), and a
# residual stream's values are in the tens to thousands; 3e38 is finite as float32 but its square is not, so
# the first norm after it makes every logit NaN. Even at the strength limit (1000) a value this size stays
# far inside float32's range through a norm's sum of squares.
MAX_VALUE = 1e6


@dataclass(frozen=True, eq=False)
class SteeringVector:
    """Per-layer directions, float32 (n_layer, n_embd), for a model with `n_layer` layers of width `n_embd`.

    Build with `SteeringVector(name, directions)` or `SteeringVector.from_layers(name, {layer: direction}, ...)`;
    load and save with `engine.steering.load_vector` / `save_vector` (llama.cpp's control-vector GGUF),
    train with `engine.steering.train_vector`. The array is copied and made read-only. Every problem
    (NaN or infinite values, a direction for layer 0, a ragged shape) is a `SteeringError` in words.

    Attributes:
        name: what the user calls it ("happy", the file's stem); shown in records and the panel.
        directions: (n_layer, n_embd) float32; row i is added to decoder layer i's output; row 0 is zero.
        model_hint: the architecture it was made for, as llama.cpp names it ("llama"); "" when unknown.
        source: where it came from, for people ("trained: pca, 32 pairs of happy/sad", a file path).
    """

    name: str
    directions: np.ndarray
    model_hint: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise SteeringError(f"a steering vector needs a name, got {self.name!r}")
        try:
            arr = np.array(self.directions, dtype=np.float32, copy=True, order="C")
        except (TypeError, ValueError) as e:
            raise SteeringError(f"steering vector {self.name!r}: its directions are not an array of numbers ({e})") from e
        if arr.ndim != 2 or arr.shape[0] < 2 or arr.shape[1] < 1:
            raise SteeringError(
                f"steering vector {self.name!r} must be (layers, width) with at least 2 layers, got shape {arr.shape}"
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            layer = int(np.argwhere(bad)[0][0])
            raise SteeringError(f"steering vector {self.name!r} has NaN or infinite values at layer {layer}")
        if (top := float(np.abs(arr).max())) > MAX_VALUE:
            layer = int(np.argwhere(np.abs(arr) == top)[0][0])
            where = f" ({self.source})" if self.source else ""
            raise SteeringError(
                f"steering vector {self.name!r}{where} holds a value of {top:.3g} at layer {layer}; a steering "
                f"direction's values stay within ±{MAX_VALUE:g} (trained ones within ±1), so this one would make "
                "the model's numbers overflow"
            )
        if np.any(arr[0]):
            raise SteeringError(
                f"steering vector {self.name!r} has a direction for layer 0, which llama.cpp's control vectors "
                "cannot steer (they start at layer 1)"
            )
        arr.setflags(write=False)
        object.__setattr__(self, "directions", arr)
        object.__setattr__(self, "model_hint", str(self.model_hint or ""))
        object.__setattr__(self, "source", str(self.source or ""))

    @classmethod
    def from_layers(
        cls,
        name: str,
        layers: Mapping[int, Any],
        *,
        n_layer: int,
        n_embd: int | None = None,
        model_hint: str = "",
        source: str = "",
    ) -> "SteeringVector":
        """A vector from {layer: direction (n_embd,)}, layers 1..n_layer-1; layers not given stay zero."""
        if not layers:
            raise SteeringError(f"steering vector {name!r} has no directions")
        rows = {}
        for layer, direction in layers.items():
            if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 1 <= int(layer) < n_layer:
                raise SteeringError(
                    f"steering vector {name!r} has a direction for layer {layer!r}; layers 1..{n_layer - 1} can be "
                    f"steered in a model of {n_layer} layers"
                )
            rows[int(layer)] = np.asarray(direction, dtype=np.float32).reshape(-1)
        widths = {r.shape[0] for r in rows.values()}
        if len(widths) != 1 or (n_embd is not None and widths != {n_embd}):
            raise SteeringError(f"steering vector {name!r}: its directions have widths {sorted(widths)}"
                                + (f", expected {n_embd}" if n_embd is not None else ""))
        width = widths.pop()
        arr = np.zeros((n_layer, width), dtype=np.float32)
        for layer, row in rows.items():
            arr[layer] = row
        return cls(name, arr, model_hint=model_hint, source=source)

    @property
    def n_layer(self) -> int:
        return int(self.directions.shape[0])

    @property
    def n_embd(self) -> int:
        return int(self.directions.shape[1])

    @property
    def shape(self) -> ResidualShape:
        return ResidualShape(self.n_layer, self.n_embd, self.model_hint)

    @functools.cached_property
    def digest(self) -> str:
        """The first DIGEST_CHARS hex characters of sha256 over the shape and the float32 bytes: its identity."""
        h = hashlib.sha256(f"{self.n_layer}x{self.n_embd}:".encode())
        h.update(self.directions.astype("<f4", copy=False).tobytes())
        return h.hexdigest()[:DIGEST_CHARS]

    def layers(self) -> tuple[int, ...]:
        """The layers this vector steers (its non-zero rows), in order."""
        return tuple(int(i) for i in np.flatnonzero(np.any(self.directions != 0, axis=1)))

    def check_for(self, model: ResidualShape, model_name: str = "this model") -> None:
        """SteeringError in words unless this vector fits `model` (same layer count and width)."""
        if (self.n_layer, self.n_embd) != (model.n_layer, model.n_embd):
            made = self.shape.describe()
            raise SteeringError(
                f"steering vector {self.name!r} was made for a model with {made}; {model_name} has "
                f"{model.describe()}"
            )

    def renamed(self, name: str) -> "SteeringVector":
        return SteeringVector(name, self.directions, self.model_hint, self.source)

    def record(self) -> dict[str, Any]:
        """What an answer's record keeps of it: name, content hash and the model facts; not the numbers."""
        return {"name": self.name, "sha256": self.digest, "n_layer": self.n_layer, "n_embd": self.n_embd,
                "model_hint": self.model_hint}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SteeringVector) and (self.name, self.digest) == (other.name, other.digest)

    def __hash__(self) -> int:
        return hash((self.name, self.digest))

    def __repr__(self) -> str:
        return f"SteeringVector({self.name!r}, {self.n_layer}x{self.n_embd}, sha256 {self.digest})"
