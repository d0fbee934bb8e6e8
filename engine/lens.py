"""The layer view (logit lens) and attention of one position: backend-neutral values and arithmetic.

A backend that implements `engine.capabilities.LayerLens` captures, for the
residual stream that predicts token `position` (it is read at `position - 1`):

- every decoder layer's output, put through the model's final norm and
  unembedding as if the model stopped there (the logit lens): (L, V) logits;
- optionally the attention of that query over positions 0..position-1, per
  layer and head: (L, H, position) weights, each row summing to 1.

`summarize` turns the (L, V) logits into what leaves the worker: the top-k
tokens per layer and the target token's log-prob and rank per layer, never a
full-vocabulary array. `position` follows the token it predicts, so the
layer view of an answer's token i is position `len(prompt) + i`, and the
default (len(token_ids)) is the next token after the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.capabilities import LayerLens, require
from engine.layer_capture import LayerCapture, LayerPrediction

if TYPE_CHECKING:
    from engine.backend import Backend

DEFAULT_TOP_K = 10


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32 (float64 sums: a 262k-token row loses digits in float32)."""
    x = logits.astype(np.float32, copy=False)
    m = x.max(axis=-1, keepdims=True)
    lse = np.log(np.exp((x - m).astype(np.float64)).sum(axis=-1, keepdims=True)).astype(np.float32)
    return x - m - lse


def summarize(layer_logits: np.ndarray, position: int, target_id: int | None, top_k: int,
              attention: np.ndarray | None = None) -> LayerCapture:
    """A LayerCapture from (L, V) logits: top-k per layer and the target's log-prob and rank.

    `target_id` None: the last layer's top-1 (the token the model itself would predict).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    logprobs = log_softmax(np.atleast_2d(layer_logits))  # (L, V)
    k = min(top_k, logprobs.shape[1])
    if target_id is None:
        target_id = int(np.argmax(logprobs[-1]))
    layers = []
    for row in logprobs:
        idx = np.argpartition(-row, k - 1)[:k]
        idx = idx[np.argsort(-row[idx], kind="stable")]
        target = float(row[target_id])
        layers.append(LayerPrediction(
            top=tuple((int(i), float(row[i])) for i in idx),
            target_logprob=target,
            target_rank=int((row > target).sum()),
        ))
    return LayerCapture(position=position, target_id=int(target_id), layers=tuple(layers), attention=attention)


def check_positions(token_ids: Sequence[int], positions: Sequence[int], vocab_size: int) -> tuple[list[int], list[int]]:
    """(ids, positions sorted) after checking them; ValueError in words otherwise.

    A position is the index of a predicted token: 1..len(token_ids) (len: the next token after the ids).
    """
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("the layer view needs at least one token of context")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    wanted = sorted({int(p) for p in positions})
    if not wanted:
        raise ValueError("no position asked for")
    for p in wanted:
        if not 1 <= p <= len(ids):
            raise ValueError(
                f"position {p} is outside 1..{len(ids)}: a position is the index of a predicted token "
                f"({len(ids)}: the next token after these {len(ids)} tokens)"
            )
    return ids, wanted


def target_of(ids: Sequence[int], position: int) -> int | None:
    """The token at `position` when the ids reach it, else None (the model's own top-1 is used)."""
    return int(ids[position]) if position < len(ids) else None


def capture(backend: Backend, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = DEFAULT_TOP_K,
            attention: bool = False) -> list[LayerCapture]:
    """The layer view of `positions` on `backend` (on its worker thread); MissingCapabilityError in words when
    the model has none (a server)."""
    return require(backend, LayerLens, "The layer view").layer_capture(
        token_ids, positions, top_k=top_k, attention=attention)
