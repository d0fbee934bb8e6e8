"""The top of the model's row, found once per token and shared: `RowHead`.

Three things per token want the highest scores of the model's (V,) row:
top-k's cut (the chain, before the draw), the model's top N and the chosen
token's rank (the report, after). Each used to find them on its own: a
comparison pass over the vocabulary per try of its reach, a pass to turn
top-k's mask into ids and one more for the rank -- 1 ms a token at 262k.
The head is the entries within `reach` nats of the max, ascending ids, found
by one comparison pass (more only when a reach holds too few), and then each
of them partitions a few hundred entries instead of V (llama.cpp's upstream
top-N fix, PR #24796, is the same idea).

Exact, not approximate: every entry at or above the head's floor is in it,
so the k-th largest value, the top-N set (ties at the cut broken by the
lowest id: the head is in id order) and the count of entries above a token
inside it are those of the whole row.
"""

from __future__ import annotations

import numpy as np

# How far below the max the head reaches on each try (nats); the last try is the whole row. A language
# model's top 40 usually lie within 8 to 12 nats of its top token (engine.sampling.stages.kth_largest).
_REACH: tuple[np.float32, ...] = (np.float32(8.0), np.float32(12.0), np.float32(16.0), np.float32(32.0))


class RowHead:
    """The entries of one (V,) score row near its max, found when first asked and widened when too few.

    Attributes:
        row: the (V,) float32 row (never written to).
        m: its max (float32).
    """

    __slots__ = ("_floor", "_ids", "_vals", "m", "row")

    def __init__(self, row: np.ndarray, m: np.floating | None = None) -> None:
        self.row = row
        self.m = np.float32(row.max() if m is None else m)
        self._ids: np.ndarray | None = None  # ascending ids of the head; None before the first look / a flat row
        self._vals: np.ndarray | None = None
        self._floor = np.float32(np.inf)  # every entry >= this is in the head

    def _ensure(self, n: int) -> None:
        """Widen the head until it holds at least `n` entries (or is the whole row)."""
        if self._vals is not None and self._vals.size >= n:
            return
        row, v = self.row, self.row.size
        mask = np.empty(v, dtype=bool)
        for reach in _REACH:
            floor = self.m - reach
            if floor >= self._floor:
                continue  # no wider than what is known already
            np.greater_equal(row, floor, out=mask)
            c = int(np.count_nonzero(mask))
            if c >= n:
                if c * 4 > v:
                    break  # a flat row: the head would be most of it anyway
                self._ids = np.flatnonzero(mask)
                self._vals, self._floor = row[self._ids], floor
                return
        self._ids, self._vals, self._floor = None, row, np.float32(-np.inf)

    def kth_largest(self, k: int) -> np.floating:
        """The k-th largest score (0 < k < V), as `np.partition(row, V - k)[V - k]`."""
        self._ensure(k)
        vals = self._vals
        assert vals is not None
        return np.partition(vals, vals.size - k)[vals.size - k]

    def at_least(self, kth: np.floating) -> np.ndarray | None:
        """Ascending ids of the entries >= `kth` (a value `kth_largest` gave), or None on a flat row (then a
        mask is cheaper to make than ids)."""
        if self._ids is None:
            return None
        assert self._vals is not None
        return self._ids[self._vals >= kth]

    def top_local(self, n: int) -> np.ndarray:
        """The ids of the n largest entries, ties at the cut to the lowest ids, as `distribution.top_local`."""
        v = self.row.size
        if n >= v:
            return np.arange(v)
        self._ensure(n)
        pool = self._vals
        assert pool is not None
        kth = np.partition(pool, pool.size - n)[pool.size - n]  # the n-th largest value
        above = np.flatnonzero(pool > kth)
        tied = np.flatnonzero(pool == kth)[: n - above.size]  # ascending: lowest ids first
        local = np.concatenate((above, tied))
        return local if self._ids is None else self._ids[local]

    def rank(self, token: int) -> int:
        """How many entries are strictly larger than `token`'s."""
        s = self.row[token]
        if self._vals is not None and s >= self._floor:  # all the larger ones are in the head
            return int(np.count_nonzero(self._vals > s))
        return int(np.count_nonzero(self.row > s))
