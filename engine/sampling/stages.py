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
filter's boundary, every tied token is kept (transformers keeps the ones its
sort happens to put first), so the result never depends on sort stability.

Speed: the chain runs once per generated token on vocabularies up to ~262k,
with a budget of a few milliseconds for everything. Full-vocabulary sorts
(an `argsort` of 262k floats takes ~4 ms) are avoided: top-k uses
`np.partition`, top-p / typical-p sort only a head of candidates that is
grown until it holds the requested mass, and min-p is a single comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

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
    """

    history: np.ndarray
    rng: np.random.Generator


Stage = Callable[[np.ndarray, StageContext], np.ndarray]


def _identity(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
    return scores


def keep_only(scores: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """`scores` with -inf wherever `keep` is False (a new array, or `scores` if all kept).

    A filter usually keeps a handful of tokens out of a large vocabulary; a
    scatter into a fresh -inf row is then much cheaper than `np.where`,
    whose cost on 262k entries is dominated by branch mispredictions.
    """
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
# A fresh 1 MB array (262k float32) costs more in page faults than in
# arithmetic once the allocator hands memory back to the OS between tokens;
# 256 KB chunks are reused from the heap.
CHUNK = 1 << 16


def exp_sums(vals: np.ndarray, m: float | np.floating, entropy: bool = False) -> tuple[float, float]:
    """(Z, S) with Z = sum(exp(v - m)) and S = sum(exp(v - m) * (v - m)).

    `m` is the max, so every term is <= 1 and nothing overflows. The float32
    terms are summed in float64, so a cumulative sum of the same terms (top-p,
    typical-p, the draw) agrees with Z to ~1e-16: a cut at p = 0.999999 is
    decided by the terms, not by rounding. S (for the entropy, log Z - S / Z) is
    only computed when asked and needs finite `vals`.
    """
    n = vals.size
    c = min(n, CHUNK)
    d = np.empty(c, np.float32)
    e = np.empty(c, np.float32)
    m32 = np.float32(m)
    z = s = 0.0
    for i in range(0, n, c):
        k = min(c, n - i)
        np.subtract(vals[i : i + k], m32, out=d[:k])
        np.exp(d[:k], out=e[:k])
        z += float(e[:k].sum(dtype=np.float64))
        if entropy:
            # einsum, not np.dot: some BLAS builds are pathologically slow on long vectors.
            s += float(np.einsum("i,i->", e[:k], d[:k]))
    return z, s


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

    def top_k(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        v = scores.size
        if k >= v:
            return scores
        # np.partition is O(V); the k-th largest lands at position V - k.
        kth = np.partition(scores, v - k)[v - k]
        if kth == NEG_INF:
            return scores
        return keep_only(scores, scores >= kth)

    return top_k


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

    def top_p(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
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
        return keep_only(scores, mask)

    return top_p


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

    def min_p(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        return keep_only(scores, scores >= scores.max() + log_p)

    return min_p


def make_typical_p(p: float) -> Stage:
    """Locally typical sampling (`TypicalLogitsWarper`, Meister et al. 2022).

    Ranks tokens by how far their surprise (-log prob) is from the entropy of
    the distribution, and keeps the smallest set of the most *typical* ones
    whose probability reaches `p`. Unlike top-p this can drop the most
    likely token when the distribution is flat... except that transformers
    (and we) always keep at least one token: the most typical. p = 1 is off.

    Like top-p, only a head (tokens with |surprise - entropy| <= reach) is
    sorted; the reach doubles until the head holds mass p.
    """
    if not 0 < p <= 1:
        raise ValueError(f"typical_p must be in (0, 1], got {p}")
    if p == 1:
        return _identity

    def typical_p(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        ids, vals = finite_part(scores)
        m = vals.max()
        z, ed = exp_sums(vals, m, entropy=True)
        log_z = math.log(z)
        ent = log_z - ed / z
        # |surprise - entropy| = |-(s - m - log Z) - H| = |s - (m + log Z - H)|
        shift = vals - np.float32(float(m) + log_z - ent)
        np.abs(shift, out=shift)
        target = p * z
        head = None
        for reach in _TYPICAL_REACH:
            cand = np.flatnonzero(shift <= reach)
            if float(np.exp(vals[cand] - m).sum(dtype=np.float64)) >= target:
                head = cand
                break
        if head is None:
            head = np.arange(vals.size)
        order = head[np.argsort(shift[head], kind="stable")]
        j = _prefix_end(np.exp(vals[order] - m), target)
        keep = shift <= shift[order[j]]
        if ids is None:
            return keep_only(scores, keep)
        out = np.full_like(scores, NEG_INF)
        kept = ids[keep]
        out[kept] = scores[kept]
        return out

    return typical_p


def make_xtc(probability: float, threshold: float) -> Stage:
    """XTC, "exclude top choices" (text-generation-webui / llama.cpp).

    With chance `probability` per step, remove every token whose probability
    is >= `threshold` *except the least likely of them*, and only when at
    least two are above the threshold. The idea: when several continuations
    are all clearly viable, skip the most predictable ones for variety, but
    never leave the model without a viable choice. So this is the one stage
    that may remove the most likely token, by design.

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
