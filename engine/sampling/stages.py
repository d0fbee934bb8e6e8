"""Sampler stages: pure functions over one row of unnormalized logits.

Style follows mlx-lm's `sample_utils.py`: a factory takes the stage's setting
and returns a small function. Every stage has the same shape::

    fn(scores: (V,) float32, ctx: StageContext) -> (V,) float32

`scores` are unnormalized logits; a token a filter removed is `-inf`, so
`np.exp` gives it probability 0 and later stages need no separate mask. A
stage never mutates its input: it returns a new array, or `scores` itself
when it changes nothing (callers must not mutate what they get back).

Semantics follow transformers' warpers and processors, which the tests use
as oracles. One deliberate difference: where tokens *tie* exactly at a
filter's boundary, every tied token is kept (as transformers' top-k and
typical-p do; its top-p keeps whichever tied tokens its sort puts last), so
the result never depends on sort stability.

Speed: the chain runs once per generated token on vocabularies up to ~262k,
with a budget of a few milliseconds for everything. Full-vocabulary argsorts
(~4 ms for 262k floats) are avoided: top-k partitions only the scores near
the top (`kth_largest`), top-p and
typical-p take a values-only sort of a head of candidates that is grown
until it holds the requested mass (a handful of tokens on a peaked row; most
of the vocabulary on a flat one, where typical-p costs ~15 ms at 262k), and
min-p is a single comparison. Sums over the vocabulary go by chunks
(`exp_sums`) so no full-size temporaries are allocated. The filters are
`FilterStage`s: the chain asks for their keep mask and, once the first cut
has left a quarter of the vocabulary or less, runs the stages after it on the
survivors alone (engine.sampling.chain).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from engine.sampling.head import RowHead

NEG_INF = np.float32(-np.inf)

# How far (in nats below the top logit) the top-p head reaches on each try.
# Each try costs one comparison pass over V plus a sort of the head; a peaked
# distribution is settled by the first or second try.
_TOP_P_REACH: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0, 64.0)
# How far (in nats of |surprise - entropy|) the typical-p head reaches per try.
_TYPICAL_REACH: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


@dataclass(frozen=True, slots=True)
class StageContext:
    """What a stage may look at besides the scores.

    Attributes:
        history: (T,) int64 token ids seen so far, prompt included; penalties
            look at its tail.
        rng: the chain's generator; XTC draws from it once per step.
        head: the top of the model's row this step (engine.sampling.head), shared by top-k, the model's
            top N and the rank; a stage may use it only on that very row (`head.row is scores`).
    """

    history: np.ndarray
    rng: np.random.Generator
    head: RowHead | None = None


Stage = Callable[[np.ndarray, StageContext], np.ndarray]


@runtime_checkable
class StatefulStage(Protocol):
    """A stage with per-run state (mirostat's mu, adaptive-p's average, a grammar's parser).

    llama.cpp's `llama_sampler_i` in Python: `__call__` is its `apply`, `accept` tells the stage the token the
    chain picked, and `state` / `restore` take the place of its `clone` / `reset` (the decode loop steps back
    to an earlier token when a banned string appears). The chain owns one per run, never the settings.
    """

    def __call__(self, scores: np.ndarray, ctx: StageContext) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...

    def state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


def _identity(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
    return scores


Keep = Callable[[np.ndarray, StageContext], "np.ndarray | None"]


class FilterStage:
    """A stage that removes tokens and changes no score, made from its `keep` rule.

    `keep(scores, ctx)` returns a bool mask of the tokens to keep, or None when
    it keeps them all, or (on a (V,) row only) the kept positions as an integer
    array in ascending order, when it has them without a mask (top-k from the
    row's head); calling the stage applies it (`keep_only`). The chain
    calls `keep` itself, so that after the first cut it can carry on with the
    survivors alone instead of a (V,) row that is mostly -inf. A filter looks
    only at the scores, not at which token has which score, so it gives the
    same answer on the survivors as on the whole row.
    """

    __slots__ = ("__name__", "keep")

    def __init__(self, keep: Keep, name: str) -> None:
        self.keep = keep
        self.__name__ = name

    def __call__(self, scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        mask = self.keep(scores, ctx)
        return scores if mask is None else keep_only(scores, mask)


def keep_only(scores: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """`scores` with -inf wherever `keep` is False (a new array, or `scores` if all kept).

    A filter usually keeps a handful of tokens out of a large vocabulary; a
    scatter into a fresh -inf row is then much cheaper than `np.where`,
    whose cost on 262k entries is dominated by branch mispredictions.
    `keep` may also be the kept positions (ascending ints, see `FilterStage`).
    """
    if keep.dtype != np.bool_:
        out = np.full_like(scores, NEG_INF)
        out[keep] = scores[keep]
        return out
    n = int(np.count_nonzero(keep))
    if n == scores.size:
        return scores
    if n * 8 < scores.size:
        ids = np.flatnonzero(keep)
        out = np.full_like(scores, NEG_INF)
        out[ids] = scores[ids]
        return out
    return np.where(keep, scores, NEG_INF)


def finite_part(scores: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids, values) of the entries above -inf; ids is None when there are none at -inf."""
    if scores.min() > NEG_INF:
        return None, scores
    ids = np.flatnonzero(scores > NEG_INF)
    return ids, scores[ids]


# Full-vocabulary temporaries are computed in chunks of this many entries.
# A fresh 1 MB array (262k float32) can cost more in page faults than in
# arithmetic when the allocator hands memory back to the OS between tokens
# (glibc trims a heap whose free top exceeds ~2x its largest recent block);
# 64 KB chunks stay in the heap. Measured: 16k entries is as fast as 64k at
# 262k and ~1.5x faster at 49k, where bigger buffers trigger the trimming.
CHUNK = 1 << 14
_FLOOR = np.float32(-1e30)


def exp_sums(
    vals: np.ndarray, m: float | np.floating, entropy: bool = False, all_finite: bool = False
) -> tuple[float, float]:
    """(Z, S) with Z = sum(exp(v - m)) and S = sum(exp(v - m) * (v - m)).

    `m` is the max, so every term is <= 1 and nothing overflows. The float32
    terms are summed in float64, so a cumulative sum of the same terms (top-p,
    typical-p, the draw) agrees with Z to ~1e-16: a cut at p = 0.999999 is
    decided by the terms, not by rounding. S (for the entropy, log Z - S / Z)
    is only computed when asked; -inf entries count as 0 in both
    (`all_finite` promises there are none and skips a guard).
    """
    n = vals.size
    if n <= _SMALL:
        return _exp_sums_small(vals, np.float32(m), entropy, all_finite)
    c = min(n, CHUNK)
    d = np.empty(c, np.float32)
    e = np.empty(c, np.float32)
    m32 = np.float32(m)
    z = s = 0.0
    for i in range(0, n, c):
        k = min(c, n - i)
        np.subtract(vals[i : i + k], m32, out=d[:k])
        if entropy and not all_finite:  # exp(-1e30) * -1e30 is 0, exp(-inf) * -inf is NaN
            np.maximum(d[:k], _FLOOR, out=d[:k])
        np.exp(d[:k], out=e[:k])
        z += float(e[:k].sum(dtype=np.float64))
        if entropy:
            # einsum, not np.dot: some BLAS builds are pathologically slow on long vectors.
            s += float(np.einsum("i,i->", e[:k], d[:k]))
    return z, s


# Rows this short (a filter's survivors) are one chunk: summed without the chunk buffers, whose set-up costs more
# than the arithmetic on a few dozen entries. The same operations on the same values, so the same sums.
_SMALL = 1024


def _exp_sums_small(vals: np.ndarray, m32: np.float32, entropy: bool, all_finite: bool) -> tuple[float, float]:
    d = np.subtract(vals, m32)
    if entropy and not all_finite:
        np.maximum(d, _FLOOR, out=d)
    e = np.exp(d)
    z = float(e.sum(dtype=np.float64))
    return z, (float(np.einsum("i,i->", e, d)) if entropy else 0.0)


def _prefix_end(weights_in_order: np.ndarray, target: float) -> int:
    """Index of the last element of the shortest prefix whose weight reaches `target`.

    This is transformers' rule for top-p and typical-p written forwards: an
    element is kept while the mass *before* it is still below the target, so
    the element that crosses the target is kept too (at least one always is).
    """
    cum = np.cumsum(weights_in_order, dtype=np.float64)
    j = int(np.searchsorted(cum, target, side="left"))
    return min(j, cum.size - 1)


# --------------------------------------------------------------------- filters


def make_top_k(k: int) -> Stage:
    """Keep the `k` highest-scoring tokens (`TopKLogitsWarper`); k = 0 is off.

    Like transformers, the cut is `scores < (k-th largest score)`, so tokens
    tied with the k-th are all kept and more than k may survive. `k >= V`,
    or fewer than k finite tokens, removes nothing.
    """
    if k < 0:
        raise ValueError(f"top_k must be >= 0, got {k}")
    if k == 0:
        return _identity

    def top_k(scores: np.ndarray, ctx: StageContext) -> np.ndarray | None:
        if k >= scores.size:
            return None
        head = ctx.head if ctx.head is not None and ctx.head.row is scores else None
        kth = kth_largest(scores, k) if head is None else head.kth_largest(k)
        if kth == NEG_INF:
            return None
        kept = head.at_least(kth) if head is not None else None  # the ids, without a (V,) mask
        return scores >= kth if kept is None else kept

    return FilterStage(top_k, "top_k")


# How far below the top score `kth_largest` looks for the k-th largest (nats), one try after another:
# a language model's top 40 usually lie within 8 to 12 nats of its top token.
_KTH_REACH: tuple[np.float32, ...] = (np.float32(8.0), np.float32(12.0), np.float32(16.0))


def kth_largest(scores: np.ndarray, k: int) -> np.floating:
    """The k-th largest score (0 < k < size), as `np.partition(scores, size - k)[size - k]`.

    np.partition is O(V) but costs ~0.2 ms at 262k; counting the entries
    within `reach` of the top costs ~0.02 ms, so widen the reach until it
    holds k entries and, when they are few, partition only those.
    """
    v = scores.size
    m = scores.max()
    mask = np.empty(v, dtype=bool)
    c = 0
    for reach in _KTH_REACH:
        np.greater_equal(scores, m - reach, out=mask)
        c = int(np.count_nonzero(mask))
        if c >= k:
            break
    if k <= c and c * 4 <= v:
        near = scores[np.flatnonzero(mask)]
        return np.partition(near, c - k)[c - k]
    return np.partition(scores, v - k)[v - k]


def make_top_p(p: float) -> Stage:
    """Nucleus sampling (`TopPLogitsWarper`): keep the smallest set of most likely
    tokens whose probability reaches `p`; at least the top token always survives.

    Only a head of candidates is sorted: the tokens within `reach` nats of
    the top logit are a prefix of the descending order, so once the head's
    mass reaches `p` the cut lies inside it. The reach doubles until that
    holds, and the last try covers everything. The weights `exp(s - max)`
    are monotone in `s`, so a values-only `np.sort` of the head suffices
    (no argsort), and the cut is a threshold on the scores themselves.
    """
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    if p == 1:
        return _identity

    def top_p(scores: np.ndarray, ctx: StageContext) -> np.ndarray | None:
        m = scores.max()
        target = p * exp_sums(scores, m)[0]
        mask = np.empty(scores.shape, dtype=bool)  # reused: one allocation
        head = None
        for reach in _TOP_P_REACH:
            np.greater_equal(scores, m - np.float32(reach), out=mask)
            cand = scores[mask]
            if float(np.exp(cand - m).sum(dtype=np.float64)) >= target:
                head = cand
                break
        if head is None:
            head = scores[scores > NEG_INF]
        head = np.sort(head)[::-1]  # descending
        j = _prefix_end(np.exp(head - m), target)
        np.greater_equal(scores, head[j], out=mask)
        return mask

    return FilterStage(top_p, "top_p")


def make_min_p(p: float) -> Stage:
    """Keep tokens whose probability is at least `p` times the top token's
    (`MinPLogitsWarper`); p = 0 is off.

    prob_i >= p * prob_max  <=>  s_i - s_max >= log(p), so this is one
    comparison in logit space, no softmax needed. The top token (and any tie
    with it) always survives since log(p) <= 0.
    """
    if not 0 <= p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {p}")
    if p == 0:
        return _identity
    log_p = np.float32(math.log(p))

    def min_p(scores: np.ndarray, ctx: StageContext) -> np.ndarray | None:
        return scores >= scores.max() + log_p

    return FilterStage(min_p, "min_p")


def make_typical_p(p: float) -> Stage:
    """Locally typical sampling (`TypicalLogitsWarper`, Meister et al. 2022).

    Ranks tokens by how far their surprise (-log prob) is from the entropy of
    the distribution, and keeps the smallest set of the most *typical* ones
    whose probability reaches `p`: text that is neither too predictable nor
    too surprising. Unlike top-p it can drop the most likely token (when that
    token is far less surprising than average); at least one token, the most
    typical, always survives, as in transformers. p = 1 is off.

    Like top-p, only a head (tokens with |surprise - entropy| <= reach) is
    looked at, the reach doubling until the head holds mass p, and only a
    values-only sort is needed (see `_typical_cut`).
    """
    if not 0 < p <= 1:
        raise ValueError(f"typical_p must be in (0, 1], got {p}")
    if p == 1:
        return _identity

    def typical_p(scores: np.ndarray, ctx: StageContext) -> np.ndarray | None:
        ids, vals = finite_part(scores)
        m = vals.max()
        z, ed = exp_sums(vals, m, entropy=True, all_finite=True)
        log_z = math.log(z)
        ent = log_z - ed / z
        # surprise - entropy = -(s - m - log Z) - H, so |surprise - entropy| = |s - c|:
        center = np.float32(float(m) + log_z - ent)
        shift = np.abs(vals - center)  # (n,) float32
        target = p * z
        head = None
        for reach in _TYPICAL_REACH:
            cand = vals[shift <= reach]
            if float(np.exp(cand - m).sum(dtype=np.float64)) >= target:
                head = cand
                break
        if head is None:
            head = vals
        keep = shift <= _typical_cut(np.sort(head), center, m, target)
        if ids is None:
            return keep
        mask = np.zeros(scores.shape, dtype=bool)
        mask[ids[keep]] = True
        return mask

    return FilterStage(typical_p, "typical_p")


def _typical_cut(s: np.ndarray, center: np.float32, m: np.floating, target: float) -> np.float32:
    """The smallest shift k such that the tokens with |s - center| <= k weigh >= target.

    `s` is sorted ascending. No argsort by shift is needed: above the center
    the shift grows with s, below it shrinks, so each side is already in
    shift order and the mass within any shift is the sum of two prefix sums.
    The shifts are computed exactly as `abs(s - center)` would compute them.
    """
    split = int(np.searchsorted(s, center, side="left"))
    above = s[split:]  # s >= center, shift ascending
    below = s[:split][::-1]  # s < center, shift ascending
    shift_a = above - center
    shift_b = center - below
    cum_a = np.cumsum(np.exp(above - m), dtype=np.float64)
    cum_b = np.cumsum(np.exp(below - m), dtype=np.float64)
    best = np.float32(np.inf)
    for shift_x, cum_x, shift_y, cum_y in ((shift_a, cum_a, shift_b, cum_b), (shift_b, cum_b, shift_a, cum_a)):
        if shift_x.size == 0:
            continue
        # mass within shift_x[i]: this side's prefix plus the other side's tokens within it
        r = np.searchsorted(shift_y, shift_x, side="right")
        mass = cum_x + (np.concatenate(([0.0], cum_y))[r])
        i = int(np.searchsorted(mass, target, side="left"))  # mass is non-decreasing
        if i < mass.size:
            best = min(best, shift_x[i])
    if best == np.inf:  # rounding kept the target out of reach: keep the whole head
        best = max(shift_a[-1] if shift_a.size else np.float32(0), shift_b[-1] if shift_b.size else np.float32(0))
    return np.float32(best)


def make_xtc(probability: float, threshold: float) -> Stage:
    """XTC, "exclude top choices" (text-generation-webui / llama.cpp).

    With chance `probability` per step, remove every token whose probability
    is >= `threshold` *except the least likely of them*, and only when at
    least two are above the threshold. The idea: when several continuations
    are all clearly viable, skip the most predictable ones for variety, but
    never leave the model without a viable choice. So XTC removes the most
    likely token by design (typical-p may too, as a side effect).

    The draw comes from `ctx.rng` on every call, whether or not XTC then
    fires, so the random stream stays aligned from step to step. Tokens tied
    with the least likely above-threshold token are all kept.
    """
    if not 0 <= probability <= 1:
        raise ValueError(f"xtc_probability must be in [0, 1], got {probability}")
    if not 0 < threshold <= 1:
        raise ValueError(f"xtc_threshold must be in (0, 1], got {threshold}")
    if probability == 0:
        return _identity

    def xtc(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        if ctx.rng.random() >= probability:
            return scores
        m = scores.max()
        z = exp_sums(scores, m)[0]
        # prob >= threshold  <=>  s - m >= log(threshold * Z): find candidates
        # in logit space with a little slack, then decide in probability space.
        cut = np.float32(float(m) + math.log(threshold * z) - 1e-3)
        cand = np.flatnonzero(scores >= cut)
        above = cand[np.exp(scores[cand] - m) >= np.float32(threshold * z)]
        if above.size < 2:
            return scores
        least = scores[above].min()
        drop = above[scores[above] > least]
        out = scores.copy()
        out[drop] = NEG_INF
        return out

    return xtc


# ------------------------------------------------------------------ reshapers


def make_temperature(t: float) -> Stage:
    """Divide the logits by `t` (`TemperatureLogitsWarper`); t = 1 is off.

    t < 1 sharpens, t > 1 flattens. t == 0 (greedy) is the chain's business:
    it skips this stage and takes the argmax instead.
    """
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a positive number here (0 = greedy is handled by the chain), got {t}")
    if t == 1:
        return _identity
    t32 = np.float32(t)

    def temperature(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        return scores / t32

    return temperature


def make_penalties(repetition: float, presence: float, frequency: float, last_n: int) -> Stage:
    """Penalize tokens already in the last `last_n` history tokens (-1 = all, 0 = off).

    - repetition (`RepetitionPenaltyLogitsProcessor`, CTRL paper): each
      distinct seen token's logit is divided by `repetition` when positive and
      multiplied by it when negative, so it always moves *down* for a
      penalty > 1 (a plain division would raise negative logits). 1 = off.
    - presence / frequency (OpenAI): subtract `presence` once per distinct
      seen token and `frequency` times its count. 0 = off.

    Repetition is applied first, then the additive ones (llama.cpp order).
    History ids outside [0, V) are ignored, as in transformers.
    """
    if not repetition > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition}")
    if last_n < -1:
        raise ValueError(f"penalty_last_n must be >= -1, got {last_n}")
    if last_n == 0 or (repetition == 1 and presence == 0 and frequency == 0):
        return _identity
    rep = np.float32(repetition)

    def penalties(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        hist = np.asarray(ctx.history)
        if last_n > 0:
            hist = hist[-last_n:]
        hist = hist[(hist >= 0) & (hist < scores.size)]
        if hist.size == 0:
            return scores
        ids, counts = np.unique(hist, return_counts=True)
        sel = scores[ids]
        if repetition != 1:
            sel = np.where(sel < 0, sel * rep, sel / rep)
        if presence != 0 or frequency != 0:
            sel = sel - (presence + frequency * counts).astype(np.float32)
        out = scores.copy()
        out[ids] = sel
        return out

    return penalties
