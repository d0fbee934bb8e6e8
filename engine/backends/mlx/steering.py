"""Steering on MLX: each decoder layer's output gets its row of the steering added, as llama.cpp's control vectors.

mlx-lm models run `model.layers` in order, so for the backend's own forward
each entry is swapped for a wrapper that calls the layer and adds
`add[i]` to what it returns (the layer view swaps in recorders the same
way, lens.py); the layers are put back when the graph is built, so the
runners sharing the model stay unsteered. The KV cache is dropped when the
steering changes, as on the other backends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from engine.backends.mlx.lens import _Recorded
from engine.lens import check_positions
from engine.steering.settings import Steering, SteeringKey, key_of
from engine.steering.shape import ResidualShape

log = logging.getLogger(__name__)


class _Steered:
    """Calls a decoder layer and adds a fixed (d,) row to its output."""

    def __init__(self, inner: Any, row: mx.array):
        self.inner, self.row = inner, row

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(x, *args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] + self.row, *out[1:])
        return out + self.row

    def __getattr__(self, name: str) -> Any:  # the model reads e.g. `layer.use_sliding`
        return getattr(self.inner, name)


@contextlib.contextmanager
def steered_layers(model: Any, add: mx.array | None) -> Iterator[None]:
    """`model`'s layers with `add[i]` added to layer i's output (rows all zero are left alone); restored after."""
    if add is None:
        yield
        return
    layers = model.layers
    originals = list(layers)
    live = [i for i in range(len(originals)) if bool(mx.any(add[i] != 0).item())]
    try:
        for i in live:
            layers[i] = _Steered(originals[i], add[i])
        yield
    finally:
        for i in live:
            layers[i] = originals[i]


class MlxSteering:
    """`Steerable` and `ResidualStates` for `MlxBackend` (mixed in; state kept under `_steering_*`)."""

    model: Any
    stream: Any
    config: dict

    def residual_shape(self) -> ResidualShape:
        args = getattr(self.model, "args", None)
        n_layer = len(self.model.layers)
        width = int(getattr(args, "hidden_size", 0) or 0)
        if not width:
            width = int(self.model.model.embed_tokens.weight.shape[1])
        return ResidualShape(n_layer, width, str(getattr(args, "model_type", "") or ""))

    def current_steering(self) -> Steering | None:
        return getattr(self, "_steering_now", None)

    def steering_key(self) -> SteeringKey | None:
        return key_of(self.current_steering())

    def _array_for(self, steering: Steering | None) -> mx.array | None:
        if steering is None or not steering.active:
            return None
        combined = steering.combined(self.residual_shape())  # checks fit first
        dtype = self.model.model.embed_tokens.weight.dtype
        return mx.array(combined).astype(dtype)

    def set_steering(self, steering: Steering | None) -> None:
        if steering is not None and not steering.active:
            steering = None
        if key_of(steering) == self.steering_key():
            return
        add = self._array_for(steering)
        self._steering_now, self._steering_add = steering, add
        self.trim_cache(0)  # type: ignore[attr-defined]  # (CachedTokens) the old prefix was computed otherwise
        log.debug("mlx steering: %s", steering.describe() if steering else "none")

    def steered(self) -> contextlib.AbstractContextManager[None]:
        """The backend's own forward under its steering (wrap the graph building, not the evaluation)."""
        return steered_layers(self.model, getattr(self, "_steering_add", None))

    def steered_logits(self, token_ids: Sequence[int], positions: Sequence[int], steering: Steering | None) -> np.ndarray:
        vocab = int(self.info.vocab_size)  # type: ignore[attr-defined]  # (MlxBackend) the model's ModelInfo
        ids, wanted = check_positions(token_ids, positions, vocab)
        with mx.stream(self.stream):
            add = self._array_for(steering)
            x = mx.array(ids[: wanted[-1]], dtype=mx.int32)[None]
            with steered_layers(self.model, add):
                logits = self.model(x)[0]  # (T, V)
            rows = logits[mx.array([p - 1 for p in wanted])].astype(mx.float32)
            mx.eval(rows)
        return np.array(rows)

    def last_token_states(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        shape = self.residual_shape()
        seqs = [[int(t) for t in s] for s in sequences]
        if not seqs or any(not s for s in seqs):
            raise ValueError("every sequence needs at least one token")
        out = np.empty((len(seqs), shape.n_layer, shape.n_embd), dtype=np.float32)
        layers = self.model.layers
        with mx.stream(self.stream):
            for n, s in enumerate(seqs):
                kept: list[mx.array] = []
                originals = list(layers)
                try:
                    for i, layer in enumerate(originals):
                        layers[i] = _Recorded(layer, kept)
                    self.model.model(mx.array(s, dtype=mx.int32)[None])
                finally:
                    for i, layer in enumerate(originals):
                        layers[i] = layer
                last = mx.stack([h[0, -1] for h in kept]).astype(mx.float32)  # (L, d)
                mx.eval(last)
                out[n] = np.array(last)
        return out
