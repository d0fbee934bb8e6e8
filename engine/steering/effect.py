"""What steering did: one position's distribution with and without it, and an answer's "unsteered shadow".

Both run on the backend's worker thread through `Steerable.steered_logits`,
on a context of their own (as the layer view does), so the chat's KV cache
and the backend's own steering are untouched.

- `steering_effect(backend, ids, position, steering)`: the token at
  `position` under the steering and without it: KL(steered ‖ unsteered), the
  chosen token's probability and rank both ways, the tokens that rose and
  fell most (by log-probability). Only small values leave the worker unless
  `full=True` (the research API) asks for both (V,) distributions.
- `unsteered_shadow(backend, ids, first, steering)`: every answer token
  (positions first..len(ids)-1) scored under the unsteered model and the
  steered one, one pass each over the whole text: per token KL, both
  log-probs of the chosen token and its unsteered rank. The token view's
  colour mode "by steering effect" reads `kl`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.capabilities import Steerable, require
from engine.errors import GenerationCancelled
from engine.lens import check_positions, log_softmax
from engine.steering.settings import Steering

DEFAULT_TOP_K = 10
SHADOW_CHUNK = 64  # positions in the shadow's first steered_logits call: (64, V) float32 is 12 MB at 49k tokens
# ... and in each later one, as many as a (P, V) float32 of this size holds. Every call decodes the answer up to its
# last position in a context of its own, so the cost grows with the number of calls: 64 at a time, a 453-token
# answer took 173 s on SmolLM2 here (its chunks 7 s, then 8, 15, … 36 s); with this budget, 3 calls: 53 s.
SHADOW_PASS_BYTES = 64 << 20


@dataclass(frozen=True)
class TokenShift:
    """One token's log-probability with and without steering (natural log)."""

    token_id: int
    steered_logprob: float
    unsteered_logprob: float

    @property
    def delta(self) -> float:
        """steered - unsteered: > 0 the steering made it more likely."""
        return self.steered_logprob - self.unsteered_logprob


@dataclass(frozen=True)
class SteeringEffect:
    """The distribution predicting token `position` with and without steering (see module doc).

    `token_id` is the token at `position` when the ids reach it (the answer's chosen token), else the
    steered distribution's top token. Ranks are 0-based (0: the most likely). `steered_top` and
    `unsteered_top` are (token_id, logprob) best first; `risers` / `fallers` the tokens whose log-prob
    rose / fell most, among the tokens in either top-k (so a token that vanished from both is not listed).
    """

    position: int
    token_id: int
    kl: float  # KL(steered ‖ unsteered), nats
    steered_logprob: float
    unsteered_logprob: float
    steered_rank: int
    unsteered_rank: int
    steered_top: tuple[tuple[int, float], ...]
    unsteered_top: tuple[tuple[int, float], ...]
    risers: tuple[TokenShift, ...]
    fallers: tuple[TokenShift, ...]
    steering: str  # Steering.describe(), for the view's heading
    # Both full (V,) float32 log-prob rows, only when asked for (full=True; the research API).
    steered_logprobs: np.ndarray | None = field(default=None, repr=False, compare=False)
    unsteered_logprobs: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def steered_prob(self) -> float:
        return float(np.exp(self.steered_logprob))

    @property
    def unsteered_prob(self) -> float:
        return float(np.exp(self.unsteered_logprob))


@dataclass(frozen=True)
class SteeringShadow:
    """An answer scored without its steering: per answer token, (n,) arrays in answer order.

    `positions[i]` is the position of answer token i in prompt + answer (its index in the ids).
    """

    positions: tuple[int, ...]
    token_ids: tuple[int, ...]
    kl: np.ndarray  # (n,) KL(steered ‖ unsteered) per token, nats
    steered_logprob: np.ndarray  # (n,) the chosen token under the steering
    unsteered_logprob: np.ndarray  # (n,) the chosen token without it
    unsteered_rank: np.ndarray  # (n,) int, 0-based rank of the chosen token without steering

    @property
    def logprob_delta(self) -> np.ndarray:
        """steered - unsteered log-prob of each chosen token: > 0 the steering pushed it."""
        return self.steered_logprob - self.unsteered_logprob


def _kl_rows(p_log: np.ndarray, q_log: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) per row of (n, V) log-prob arrays, summed in float64."""
    p = np.exp(p_log.astype(np.float64))
    return np.maximum((p * (p_log.astype(np.float64) - q_log.astype(np.float64))).sum(axis=-1), 0.0)


def _top(row: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    k = min(k, row.shape[0])
    idx = np.argpartition(-row, k - 1)[:k]
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return tuple((int(i), float(row[i])) for i in idx)


def _check_steering(steering: Steering) -> None:
    if not isinstance(steering, Steering):
        raise TypeError(f"steering must be an engine.steering.Steering, got {type(steering).__name__}")
    if not steering.active:
        raise ValueError("the steering changes nothing (no vector at a non-zero strength): there is no effect to show")


def steering_effect(
    backend: object,
    token_ids: Sequence[int],
    position: int,
    steering: Steering,
    *,
    top_k: int = DEFAULT_TOP_K,
    full: bool = False,
) -> SteeringEffect:
    """The effect of `steering` on the token at `position` (1..len(token_ids)); on the backend's worker thread.

    MissingCapabilityError in words on a model that cannot steer (a server); SteeringError when a vector
    does not fit the model.
    """
    _check_steering(steering)
    model = require(backend, Steerable, "what steering did to a token")
    n_vocab = int(getattr(getattr(backend, "info", None), "vocab_size", 0) or 0) or 1 << 31
    ids, wanted = check_positions(token_ids, [position], n_vocab)
    steering.check_for(model.residual_shape())
    steered = log_softmax(model.steered_logits(ids, wanted, steering))[0]
    plain = log_softmax(model.steered_logits(ids, wanted, None))[0]
    p = wanted[0]
    token = int(ids[p]) if p < len(ids) else int(np.argmax(steered))
    kl = float(_kl_rows(steered[None], plain[None])[0])
    s_top, u_top = _top(steered, top_k), _top(plain, top_k)
    candidates = sorted({t for t, _ in s_top} | {t for t, _ in u_top})
    shifts = [TokenShift(t, float(steered[t]), float(plain[t])) for t in candidates]
    shifts.sort(key=lambda s: s.delta)
    fallers = tuple(s for s in shifts[:top_k] if s.delta < 0)
    risers = tuple(s for s in reversed(shifts[-top_k:]) if s.delta > 0)
    return SteeringEffect(
        position=p,
        token_id=token,
        kl=kl,
        steered_logprob=float(steered[token]),
        unsteered_logprob=float(plain[token]),
        steered_rank=int((steered > steered[token]).sum()),
        unsteered_rank=int((plain > plain[token]).sum()),
        steered_top=s_top,
        unsteered_top=u_top,
        risers=risers,
        fallers=fallers,
        steering=steering.describe(),
        steered_logprobs=steered if full else None,
        unsteered_logprobs=plain if full else None,
    )


def unsteered_shadow(
    backend: object, token_ids: Sequence[int], first: int, steering: Steering, *, chunk: int = SHADOW_CHUNK,
    cancelled: Callable[[], bool] = lambda: False, progress: Callable[[int, int], None] | None = None,
) -> SteeringShadow:
    """Answer tokens `token_ids[first:]` scored with and without `steering`, per token (see SteeringShadow).

    `first` is the answer's first position (the prompt's length, at least 1). On the worker thread. A long
    answer takes a while (two passes per chunk of positions: `chunk` first, then as many as `SHADOW_PASS_BYTES`
    of logits hold): `progress(done, total)` (answer tokens) is called after each chunk, and `cancelled()` is
    checked before each (GenerationCancelled).
    """
    _check_steering(steering)
    model = require(backend, Steerable, "the unsteered shadow of an answer")
    ids = [int(t) for t in token_ids]
    if not 1 <= first < len(ids):
        raise ValueError(f"the answer starts at position {first}, outside 1..{len(ids) - 1} of these {len(ids)} tokens")
    steering.check_for(model.residual_shape())
    positions = list(range(first, len(ids)))
    kl, s_lp, u_lp, u_rank = [], [], [], []
    lo, size = 0, chunk
    while lo < len(positions):
        if cancelled():
            raise GenerationCancelled("the steering effect of the answer was cancelled")
        part = positions[lo : lo + size]
        lo += len(part)
        steered = log_softmax(model.steered_logits(ids, part, steering))
        if lo == len(part) and lo < len(positions):  # after the first (quick) call: fewer, larger, even ones
            most = max(chunk, SHADOW_PASS_BYTES // (4 * max(1, steered.shape[-1])))
            rest = len(positions) - lo
            calls = -(-rest // most)
            size = -(-rest // calls)  # no small last call: it would cost a whole pass over the answer too
        plain = log_softmax(model.steered_logits(ids, part, None))
        chosen = np.array([ids[p] for p in part])
        rows = np.arange(len(part))
        kl.append(_kl_rows(steered, plain))
        s_lp.append(steered[rows, chosen])
        u_lp.append(plain[rows, chosen])
        u_rank.append((plain > plain[rows, chosen][:, None]).sum(axis=1))
        if progress is not None:
            progress(lo, len(positions))
    return SteeringShadow(
        positions=tuple(positions),
        token_ids=tuple(ids[first:]),
        kl=np.concatenate(kl).astype(np.float32),
        steered_logprob=np.concatenate(s_lp).astype(np.float32),
        unsteered_logprob=np.concatenate(u_lp).astype(np.float32),
        unsteered_rank=np.concatenate(u_rank).astype(np.int64),
    )
