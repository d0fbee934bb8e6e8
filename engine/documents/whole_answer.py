"""The whole answer's bar: how an answer's tokens, together, spread their attention over the passages.

One token's view (attention.py) sums the captured (layer, head, position) attention over heads and the chosen
layers. For the whole answer that array, per token, is too big to keep (SmolLM2 over a 4,000-token prompt: 30
layers x 9 heads x 4,000 positions x 4 bytes = 4.3 MB a token), so each token's is reduced on the model's
thread to its mass per layer and passage, (layers, passages), and the layers are chosen afterwards (the panel's
"later half" / "all"), as for one token, without running the model again. A long answer is read at up to
`MAX_TOKENS` evenly spaced tokens (the bar says how many); the capture runs `CHUNK` positions per forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.documents.attention import Passage
from engine.lens import capture

if TYPE_CHECKING:
    from engine.backend import Backend

MAX_TOKENS = 128  # answer tokens read for the bar at most: a 1,000-token answer takes ~8 forwards, not 63
CHUNK = 16  # positions captured per forward: 16 x (layers, heads, prompt) arrays stay small


@dataclass(frozen=True)
class AnswerAttention:
    """Per read answer token and layer, each passage's mass (summed over heads, divided by them)."""

    passages: tuple[Passage, ...]
    positions: tuple[int, ...]  # the answer tokens read (indices in the ids, as `attention_map` takes them)
    layer_mass: np.ndarray  # (tokens, layers, passages)
    answer_tokens: int  # the answer's length: more than len(positions) when the tokens were spaced out

    def share(self, layers: Sequence[int] | None = None) -> tuple[float, ...]:
        """Each passage's part of the answer's attention on passages, over `layers` (None: all), the tokens
        averaged — `AttentionMap.share` for the same tokens and layers."""
        n_layers = self.layer_mass.shape[1]
        chosen = list(range(n_layers)) if layers is None else sorted({int(i) for i in layers})
        if not chosen or any(not 0 <= i < n_layers for i in chosen):
            raise ValueError(f"layers must be among 0..{n_layers - 1}, got {list(layers or [])}")
        if not self.positions:
            return tuple(0.0 for _ in self.passages)
        mass = self.layer_mass[:, chosen, :].sum(axis=1).mean(axis=0) / len(chosen)
        total = float(mass.sum())
        return tuple(float(m) / total if total > 0 else 0.0 for m in mass)


def spaced(positions: Sequence[int], at_most: int = MAX_TOKENS) -> tuple[int, ...]:
    """`positions`, or `at_most` of them evenly spaced (first and last kept) when there are more."""
    if len(positions) <= at_most:
        return tuple(positions)
    picks = np.linspace(0, len(positions) - 1, at_most).round().astype(int)
    return tuple(positions[i] for i in sorted(set(picks.tolist())))


def _layer_mass(attention: np.ndarray, passages: Sequence[Passage]) -> np.ndarray:
    """(layers, passages) from one capture's (layers, heads, position) attention."""
    per_layer = attention.astype(np.float64).sum(axis=1) / attention.shape[1]  # (layers, position)
    width = per_layer.shape[1]
    return np.stack([per_layer[:, min(p.first_token, width):min(p.end_token, width)].sum(axis=1)
                     for p in passages], axis=1) if passages else np.zeros((per_layer.shape[0], 0))


def answer_attention(backend: Backend, ids: Sequence[int], positions: Sequence[int], passages: Sequence[Passage]
                     ) -> AnswerAttention:
    """Where the answer tokens at `positions` of `ids` looked, per layer, over `passages` (run it on the
    model's worker thread, e.g. `Engine.call`); MissingCapabilityError in words on a model without the layer
    view."""
    read = spaced(positions)
    rows: list[np.ndarray] = []
    for at in range(0, len(read), CHUNK):
        for c in capture(backend, ids, read[at:at + CHUNK], top_k=1, attention=True):
            if c.attention is None:
                raise RuntimeError("the layer view returned no attention for this model")
            rows.append(_layer_mass(c.attention, passages))
    layer_mass = np.stack(rows) if rows else np.zeros((0, 0, len(passages)))
    return AnswerAttention(tuple(passages), read, layer_mass, len(positions))
