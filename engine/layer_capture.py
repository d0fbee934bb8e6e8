"""What the layer view captures at one position: per-layer predictions and, when asked, attention.

Plain values shared by `engine.capabilities.LayerLens` (which returns them) and `engine.lens` (which
makes and summarises them), kept apart so neither has to import the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerPrediction:
    """What one layer's output predicts (the logit lens at that layer)."""

    top: tuple[tuple[int, float], ...]  # (token_id, logprob), best first
    target_logprob: float  # the target token's log-prob at this layer
    target_rank: int  # 0: the layer's top-1

    @property
    def target_prob(self) -> float:
        return float(np.exp(self.target_logprob))


@dataclass(frozen=True)
class LayerCapture:
    """The layer view of one position: per-layer predictions and, when asked, attention.

    `layers[i]` is decoder layer i's output through the final norm and unembedding; the last entry is
    the model's own next-token distribution. `attention`, when captured, is (L, H, position) float32:
    layer l, head h, how much the query at `position - 1` attends to each earlier position.
    """

    position: int  # index of the predicted token (the residual stream is read at position - 1)
    target_id: int  # token_ids[position] when given, else the model's own top-1
    layers: tuple[LayerPrediction, ...]
    attention: np.ndarray | None = None  # (L, H, position)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def target_probs(self) -> np.ndarray:
        """(L,) the target token's probability at every layer."""
        return np.array([p.target_prob for p in self.layers], dtype=np.float32)

    @property
    def first_top1_layer(self) -> int | None:
        """The first layer where the target is top-1 (None: at no layer)."""
        return next((i for i, p in enumerate(self.layers) if p.target_rank == 0), None)

    def attention_mean(self) -> np.ndarray | None:
        """(L, position): attention averaged over heads."""
        return None if self.attention is None else self.attention.mean(axis=1)
