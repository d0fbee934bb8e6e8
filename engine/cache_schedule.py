"""How a KV cache's positions were computed: the forward calls that made them, and how to make them again.

Why it matters: llama.cpp's CPU kernels compute a batch of tokens differently from one token at a time,
and a batch of 64 differently from one of 32 (measured on 0.3.36: SmolLM2 Q4_1 with flash attention
gives the same bits for any batch of up to 63 tokens and other bits from 64 on, up to 0.8 nats apart in
the tail of the distribution; Gemma 3 Q4_K_M differs for every batch size). So the same prompt gives other
log-probs when its start was reused from the cache of an earlier turn (prefilled, then decoded one token at
a time) than when it is computed whole, and a sampled draw near a boundary then picks another token. A
replay that is to repeat an answer bit for bit must compute the prompt's cache in the same pieces.

A schedule is a list of pieces, one per forward call, in order: `(computed, kept)` - the call ran
`computed` tokens and the first `kept` of them are still cached (a later trim cut the rest, which is what
happens when a prompt is asked again: its last token is run anew). Under a causal mask the positions kept
never saw the ones cut, so computing the piece again with any tokens in the cut places and cutting them
gives the kept positions' very numbers (tests/engine/test_cache_schedule.py checks it on llama.cpp).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Piece = tuple[int, int]  # (tokens computed by one forward call, how many of them are still cached)
MAX_RECORD_PIECES = 4096  # runs in a stored record; a record past it is refused when read
MAX_POSITIONS = 1 << 20  # positions a record may describe (more than any context here holds)


class CacheSchedule:
    """The pieces of one sequence's cache, kept in step with it (append what a forward ran, trim what is cut)."""

    def __init__(self) -> None:
        self._pieces: list[list[int]] = []  # [computed, kept], mutable so that a trim edits in place
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def ran(self, n: int) -> None:
        """A forward call computed `n` new positions at the end of the cache."""
        if n > 0:
            self._pieces.append([n, n])
            self._length += n

    def trim(self, keep: int) -> None:
        """The cache keeps its first `keep` positions."""
        keep = max(0, keep)
        while self._pieces and self._length > keep:
            piece = self._pieces[-1]
            start = self._length - piece[1]
            if start >= keep:
                self._pieces.pop()
                self._length = start
            else:
                piece[1] = keep - start
                self._length = keep

    def clear(self) -> None:
        self._pieces, self._length = [], 0

    def upto(self, n: int) -> tuple[Piece, ...]:
        """The pieces of the first `n` positions (a piece that reaches past `n` keeps only its part before)."""
        return pieces_upto(((c, k) for c, k in self._pieces), n)


def pieces_upto(pieces: Iterable[Piece], n: int) -> tuple[Piece, ...]:
    """The pieces of the first `n` positions of `pieces` (one that reaches past `n` keeps its part before)."""
    out: list[Piece] = []
    at = 0
    for computed, kept in pieces:
        if at >= n:
            break
        out.append((computed, min(kept, n - at)))
        at += kept
    return tuple(out)


def covers(schedule: Sequence[Piece], n: int) -> bool:
    """Whether `schedule` describes exactly `n` positions (every piece well formed)."""
    return sum(k for _, k in schedule) == n and all(0 < k <= c for c, k in schedule)


def reusable(cached: Sequence[Piece], wanted: Sequence[Piece]) -> int:
    """How many positions the cache can keep for a prompt to be computed in `wanted`'s pieces: those of the
    pieces both begin with, the same computed and kept counts each (the tokens are compared by the caller)."""
    at = 0
    for a, b in zip(cached, wanted):
        if a != b:
            break
        at += a[1]
    return at


# ------------------------------------------------------------------------------------------------ as stored

def to_record(schedule: Iterable[Piece]) -> list[list[int]]:
    """Run-length form for a fingerprint: [[computed, kept, times], ...] (a decoded answer is runs of [1, 1])."""
    out: list[list[int]] = []
    for c, k in schedule:
        if out and out[-1][0] == c and out[-1][1] == k:
            out[-1][2] += 1
        else:
            out.append([int(c), int(k), 1])
    return out


def check_record(record: Any) -> tuple[tuple[int, int, int], ...]:
    """A stored record checked, as (computed, kept, times) runs; ValueError in words for one that is not
    [[computed, kept, times], ...] or that describes more positions than any context holds."""
    if not isinstance(record, (list, tuple)) or len(record) > MAX_RECORD_PIECES:
        raise ValueError(f"a cache schedule is a list of at most {MAX_RECORD_PIECES} [computed, kept, times] runs")
    out: list[tuple[int, int, int]] = []
    positions = 0
    for run in record:
        ok = (isinstance(run, (list, tuple)) and len(run) == 3
              and all(isinstance(x, int) and not isinstance(x, bool) for x in run))
        if not ok or not (0 < run[1] <= run[0] <= MAX_POSITIONS and 0 < run[2] <= MAX_POSITIONS):
            raise ValueError(f"a cache schedule run must be [computed, kept, times] with 0 < kept <= computed, got {run!r}")
        positions += run[1] * run[2]
        if positions > MAX_POSITIONS:
            raise ValueError(f"a cache schedule of more than {MAX_POSITIONS} positions")
        out.append((run[0], run[1], run[2]))
    return tuple(out)


def from_record(record: Any) -> tuple[Piece, ...]:
    """The pieces of a stored record (checked: `check_record`)."""
    out: list[Piece] = []
    for c, k, times in check_record(record):
        out += [(c, k)] * times
    return tuple(out)


def describe(record: Sequence[Sequence[int]]) -> str:
    """A record for people: "48 + 120×1 + 30", a piece cut short as "31 of 32"."""
    if not record:
        return "(none)"
    parts = []
    for c, k, times in record:
        one = str(c) if c == k else f"{k} of {c}"
        parts.append(one if times == 1 else f"{times}×{one}")
    return " + ".join(parts)
