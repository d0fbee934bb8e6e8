"""Training a steering vector from contrastive pairs, the repeng way (vgel/repeng `read_representations`).

For every pair, the last token's output of every decoder layer is read for
the positive and the negative prompt (`ResidualStates`). Per layer 1..L-1:

- "pca" (repeng's "pca_diff"): the first principal component of the
  differences positive - negative (centred, as sklearn's PCA centres);
- "mean": the mean difference, scaled to unit length like a component.

The sign follows repeng: project every prompt on the direction, and flip it
when the positive prompts land below their negatives in more pairs than
above, so positive strength means "more like the positive prompts".

Layer 0 gets no direction (llama.cpp's control vectors start at layer 1),
and the last layer's states are its output before the final norm, where
steering adds to it (transformers' `hidden_states[-1]` is after the norm;
docs/steering.md says why that matters when comparing with repeng).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from engine.capabilities import ResidualStates, Steerable, require
from engine.errors import GenerationCancelled
from engine.steering.errors import SteeringError
from engine.steering.pairs import PairSet, TokenPair, check_distinct, check_pair_count
from engine.steering.vector import SteeringVector

if TYPE_CHECKING:
    from engine.backend import Backend

log = logging.getLogger(__name__)

Method = Literal["pca", "mean"]
METHODS: tuple[str, ...] = ("pca", "mean")
STATES_BATCH = 32  # prompts per ResidualStates call, so a cancel is seen between them


def first_component(diffs: np.ndarray) -> np.ndarray:
    """The unit first principal component of (n, d) rows, centred first (sklearn PCA(n_components=1))."""
    x = diffs.astype(np.float64) - diffs.astype(np.float64).mean(axis=0, keepdims=True)
    if x.shape[0] < 2 or not np.any(x):
        # One pair, or identical differences: the centred data has no spread; the difference itself is the direction.
        x = diffs.astype(np.float64)
    # The top right singular vector, from the (n, n) Gram matrix: n pairs << d dimensions.
    gram = x @ x.T
    _, vecs = np.linalg.eigh(gram)
    v = x.T @ vecs[:, -1]
    norm = np.linalg.norm(v)
    return (v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32)


def mean_difference(diffs: np.ndarray) -> np.ndarray:
    """The mean of (n, d) differences, unit length."""
    v = diffs.astype(np.float64).mean(axis=0)
    norm = np.linalg.norm(v)
    return (v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32)


def orient(direction: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """`direction` or its negation, whichever puts positive prompts above their negatives in more pairs (repeng)."""
    pos = positive.astype(np.float64) @ direction
    neg = negative.astype(np.float64) @ direction
    smaller, larger = np.mean(pos < neg), np.mean(pos > neg)
    return -direction if smaller > larger else direction


def directions_from_states(positive: np.ndarray, negative: np.ndarray, method: str = "pca") -> np.ndarray:
    """(L, d) float32 directions from (n, L, d) positive and negative last-token states; row 0 stays zero."""
    if method not in METHODS:
        raise SteeringError(f"unknown training method {method!r}; choose one of {', '.join(METHODS)}")
    if positive.shape != negative.shape or positive.ndim != 3:
        raise ValueError(f"positive and negative states must be (n, layers, width) alike, got {positive.shape} and {negative.shape}")
    n, n_layer, width = positive.shape
    out = np.zeros((n_layer, width), dtype=np.float32)
    for layer in range(1, n_layer):
        diffs = positive[:, layer] - negative[:, layer]
        d = first_component(diffs) if method == "pca" else mean_difference(diffs)
        out[layer] = orient(d, positive[:, layer], negative[:, layer])
    return out


def check_token_pairs(token_pairs: Sequence[TokenPair], name: str, context: int) -> None:
    """Every pair's prompts as tokens: not empty, not the same on both sides, and each within `context` tokens
    (the model's context; 0: unknown), or SteeringError naming the pair and by how much it is too long. Run
    before any layer is read (and by the CLI before the model loads), so a 10 MB prompt is one line, not a
    context of millions of tokens asked of the backend."""
    for i, (p, q) in enumerate(token_pairs, 1):
        if not p or not q:
            raise SteeringError(f"pair {i} of {name!r} has an empty prompt")
        for side, ids in (("positive", p), ("negative", q)):
            if context and len(ids) > context:
                raise too_long(i, name, side, f"{len(ids):,} tokens", f"{len(ids) - context:,}", context)
    check_distinct(token_pairs, name)


def too_long(pair: int, name: str, side: str, tokens: str, excess: str, context: int) -> SteeringError:
    """The words for a prompt past the model's context (`tokens`: "812 tokens"; `excess`: "556", "at least 9")."""
    return SteeringError(f"pair {pair} of {name!r}: its {side} prompt has {tokens}, {excess} more than the "
                         f"model's context of {context:,}; shorten it (a prompt for steering is a sentence or two)")


def train_vector(
    backend: Backend,
    pairs: PairSet,
    *,
    method: str = "pca",
    name: str | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int], None] | None = None,
) -> SteeringVector:
    """A steering vector for the loaded model from `pairs`; on the backend's worker thread.

    `progress(done, total)` is called after each batch of prompts; `cancelled()` is checked between batches
    (GenerationCancelled). MissingCapabilityError in words on a model whose layers cannot be read (a server).
    """
    if method not in METHODS:
        raise SteeringError(f"unknown training method {method!r}; choose one of {', '.join(METHODS)}")
    if len(pairs) == 0:
        raise SteeringError(f"the pair set {pairs.name!r} is empty: training needs at least one pair")
    check_pair_count(pairs)
    reader = require(backend, ResidualStates, "training a steering vector")
    t0 = time.perf_counter()
    token_pairs = pairs.token_pairs(backend.tokenizer)
    check_token_pairs(token_pairs, pairs.name, backend.info.context_length)
    # Positives and negatives apart: each side's prompts share their chat template and persona, which a
    # backend may then run once (llama.cpp does).
    sides = [[p for p, _ in token_pairs], [q for _, q in token_pairs]]
    total, done = 2 * len(token_pairs), 0
    states: list[list[np.ndarray]] = [[], []]
    for side, prompts in enumerate(sides):
        for lo in range(0, len(prompts), STATES_BATCH):
            if cancelled():
                raise GenerationCancelled("training the steering vector was cancelled")
            part = prompts[lo : lo + STATES_BATCH]
            states[side].append(reader.last_token_states(part))
            done += len(part)
            if progress is not None:
                progress(done, total)
    positive, negative = np.concatenate(states[0]), np.concatenate(states[1])  # (n, L, d) each
    directions = directions_from_states(positive, negative, method)
    if not np.any(directions):  # every pair's two prompts end in the same states: nothing to steer toward
        raise SteeringError(f"the pairs of {pairs.name!r} give the same layer states on both sides, so the vector "
                            "would be zero at every layer; make the positive and negative prompts differ")
    hint = require(backend, Steerable, "training a steering vector").residual_shape().model_hint \
        if isinstance(backend, Steerable) else ""
    log.info("trained steering vector %r from %d pairs (%s) in %.2f s", name or pairs.name, len(token_pairs), method,
             time.perf_counter() - t0)
    return SteeringVector(name or pairs.name, directions, model_hint=hint,
                          source=f"trained: {method}, {len(token_pairs)} pairs of {pairs.name}")
