"""Softmax summaries of one row of scores: normalizer, entropy, top-N, the seeded draw.

A row is either the whole vocabulary, (V,) with -inf for removed tokens, or,
once a filter has cut it, its survivors: ascending token ids and their
scores. `Dist` summarizes either without copying anything full-size.
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

import numpy as np

from engine.sampling.stages import NEG_INF, exp_sums, finite_part

if TYPE_CHECKING:
    from engine.sampling.head import RowHead

TopList = tuple[tuple[int, float], ...]

# Full-vocabulary sums go by chunks of this many entries (see engine.sampling.stages.CHUNK).
CHUNK = 1 << 14
# Rows this short (a filter's survivors) give their top N from one sort of them all: the first n by (score
# down, id up) are the n highest with ties at the cut to the lowest ids, in the order `top` lists them.
_SORT_ALL = 256
# How far below the top score the top-N search looks on each try (nats).
_TOP_REACH: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


class Dist:
    """Softmax summary of one score row.

    Once a filter has run, the finite entries are usually a few hundred out of
    the vocabulary: they are then gathered (`ids`, `vals`) and everything
    after is cheap. When most entries are finite the row itself is used, its
    -inf entries weighing 0, since gathering 262k entries costs more than it
    saves. Nothing full-size is copied.

    Attributes:
        ids: ascending token ids of `vals`, or None when `vals` is the whole row.
        vals: the scores (float32).
        count: tokens with a finite score.
        m: the top score; z: sum(exp(vals - m)) in float64; lse: m + log(z).
        entropy: entropy (nats) of softmax(vals).
    """

    __slots__ = ("_head", "_part", "_tops", "count", "entropy", "ids", "lse", "m", "vals", "z")
    ids: np.ndarray | None
    vals: np.ndarray

    def __init__(self, scores: np.ndarray, ids: np.ndarray | None = None, head: RowHead | None = None) -> None:
        """
        Args:
            scores: a (V,) row with -inf for removed tokens, or, with `ids`,
                the finite scores of the tokens `ids` (ascending).
            head: the (V,) row's head (engine.sampling.head), when the chain found it already: its max
                is this row's, and the top N comes from it instead of another look at the row.
        """
        if ids is not None:
            self.count = scores.size
            self.ids, self.vals = ids, scores
        else:
            v = scores.size
            count = v if scores.min() > NEG_INF else int(np.count_nonzero(scores > NEG_INF))
            self.count = count  # tokens with a finite score
            if count * 4 <= v:
                self.ids, self.vals = finite_part(scores)
            else:
                self.ids, self.vals = None, scores  # ids None: position = token id
        # The head speaks for the row itself only: not for its finite part gathered above.
        self._head = head if head is not None and self.ids is None and head.row is scores else None
        m = self.vals.max() if self._head is None else self._head.m
        z, ed = exp_sums(self.vals, m, entropy=True, all_finite=self.count == self.vals.size)
        self.m = float(m)
        self.z = z
        self.lse = self.m + math.log(z)
        # H = log Z - sum(e * (s - m)) / Z: both terms >= 0, no cancellation.
        self.entropy = max(math.log(z) - ed / z, 0.0)
        self._tops: dict[int, TopList] = {}
        self._part = False  # see `part`

    def part(self, tokens: np.ndarray) -> Dist:
        """This row kept only at `tokens` (ids in range), with the whole row's count, normalizer, entropy and the
        top lists it has given so far: what a later stage record reads of it (`mass_kept` at survivors among
        `tokens`, `finite_at` of `tokens`, `top` of an n asked before), without holding on to a (V,) row.

        The same float32 values at the same ids, so those give exactly what the whole row gives. Anything else
        (`top` of a new n, `draw`, `score` of another token) is not known to a part: `top` refuses.
        """
        if self.ids is not None and self.vals.size <= max(tokens.size, _SORT_ALL):
            return self  # a short row already: nothing to save
        out = Dist.__new__(Dist)
        ids = np.unique(tokens)  # ascending, as `ids` must be
        if self.ids is None:
            vals = self.vals[ids]
        else:  # the row's finite part: a token outside it is -inf here
            j = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
            vals = np.where(self.ids[j] == ids, self.vals[j], NEG_INF).astype(np.float32)
        out.ids, out.vals = ids, vals
        out.count, out.m, out.z, out.lse, out.entropy = self.count, self.m, self.z, self.lse, self.entropy
        out._head, out._tops, out._part = None, dict(self._tops), True
        return out

    def token_id(self, local: int) -> int:
        return local if self.ids is None else int(self.ids[local])

    def score(self, token: int) -> float:
        """The score of `token` in this row (-inf when removed)."""
        if self.ids is None:
            return float(self.vals[token])
        j = int(np.searchsorted(self.ids, token))
        return float(self.vals[j]) if j < self.ids.size and self.ids[j] == token else -math.inf

    def logprob(self, token: int) -> float:
        """log-prob of `token` under softmax(row)."""
        s = self.score(token)
        return s - self.lse if s != -math.inf else -math.inf

    def top(self, n: int) -> TopList:
        """Top-n (id, logprob), most likely first; ties broken by lower id."""
        n = min(n, self.count)
        if n <= 0:
            return ()
        known = self._tops.get(n)
        if known is not None:
            return known
        if self._part:
            raise RuntimeError(f"a part of a row (Dist.part) knows only the top lists asked of the row before, not top {n}")
        if self.vals.size <= _SORT_ALL:  # a few survivors: one sort by (score down, id up), its first n
            ids = np.arange(self.vals.size) if self.ids is None else self.ids
            vals = self.vals
            order = np.lexsort((ids, -vals))[:n]
        else:
            local = top_local(self.vals, n) if self._head is None else self._head.top_local(n)
            ids = local if self.ids is None else self.ids[local]
            vals = self.vals[local]
            order = np.lexsort((ids, -vals))
        lse = self.lse
        # tolist: Python ints and floats of the same values in one call each, not 2n numpy scalars.
        out = tuple((t, s - lse) for t, s in zip(ids[order].tolist(), vals[order].tolist()))
        self._tops[n] = out
        return out

    def draw(self, u: float) -> int:
        """Inverse-CDF draw for u in [0, 1): the first token, in id order, whose
        cumulative weight exceeds u * Z.

        Weights are float32 `exp(s - max)`, accumulated in float64 chunk by
        chunk exactly as `exp_sums` does, so the same logits and u give the
        same token on every backend and every run.
        """
        vals, n = self.vals, self.vals.size
        m = np.float32(self.m)
        target = u * self.z
        acc = 0.0
        last = 0
        for i in range(0, n, CHUNK):
            w = np.exp(vals[i : i + CHUNK] - m)
            t = float(w.sum(dtype=np.float64))
            if acc + t > target:
                cum = np.cumsum(w, dtype=np.float64)
                cum += acc
                j = int(np.searchsorted(cum, target, side="right"))
                if j >= w.size:  # rounding between the two sums: last token with weight
                    j = int(np.flatnonzero(w)[-1])
                return self.token_id(i + j)
            if t > 0:
                last = i + int(np.flatnonzero(w)[-1])
            acc += t
        return self.token_id(last)  # u * Z rounded up to Z

    def finite_at(self, tokens: np.ndarray) -> np.ndarray:
        """For each of `tokens` (ids), whether its score here is finite: `score(t) != -inf`, all at once."""
        if self.ids is None:
            return self.vals[tokens] > NEG_INF
        j = np.searchsorted(self.ids, tokens)
        jc = np.minimum(j, self.ids.size - 1)
        return (j < self.ids.size) & (self.ids[jc] == tokens) & (self.vals[jc] > NEG_INF)


def top_local(vals: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n largest `vals`; among ties at the cut, the lowest positions.

    `n` must not exceed the number of finite entries.

    An argpartition over 262k floats costs ~1 ms; counting the entries within
    `reach` of the max costs ~0.03 ms, so widen the reach until it holds n
    candidates and partition only those.
    """
    k = vals.size
    if n >= k:
        return np.arange(k)
    m = vals.max()
    mask = np.empty(k, dtype=bool)
    cand = None
    for reach in _TOP_REACH:
        np.greater_equal(vals, m - np.float32(reach), out=mask)
        c = int(np.count_nonzero(mask))
        if c >= n:
            if c * 4 <= k:  # else a flat row: the candidates are most of it anyway
                cand = np.flatnonzero(mask)
            break
    pool = vals if cand is None else vals[cand]
    kth = np.partition(pool, pool.size - n)[pool.size - n]  # the n-th largest value
    above = np.flatnonzero(pool > kth)
    tied = np.flatnonzero(pool == kth)[: n - above.size]  # ascending: lowest ids first
    local = np.concatenate((above, tied))
    return local if cand is None else cand[local]


def mass_kept(before: Dist, after: Dist) -> float:
    """Mass, under `before`, of the tokens still finite in `after`.

    Stages never bring a removed token back, so an unchanged count means an
    unchanged set.
    """
    if after.count == before.count:
        return 1.0
    m = np.float32(before.m)
    if after.ids is not None:  # few survivors: look them up
        ids = after.ids if before.ids is None else np.searchsorted(before.ids, after.ids)
        kept = float(np.exp(before.vals[ids] - m).sum(dtype=np.float64))
    else:  # most survive (both rows are full-size): sum by chunks, where `after` is finite
        kept = 0.0
        scores_after = after.vals
        for i in range(0, scores_after.size, CHUNK):
            w = np.exp(before.vals[i : i + CHUNK] - m)
            kept += float(w.sum(dtype=np.float64, where=scores_after[i : i + CHUNK] > NEG_INF))
    return min(max(kept / before.z, 0.0), 1.0)
