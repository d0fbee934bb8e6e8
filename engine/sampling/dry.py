"""DRY, "don't repeat yourself" (p-e-w, text-generation-webui PR #5677; llama.cpp `llama_sampler_init_dry`).

A token that would extend a sequence already seen in the history is penalized
by `multiplier * base ** (length - allowed_length)`, where `length` is how
long the repeated sequence already is. Sequence breakers (newline, ':', ...)
end a repeat: a repeat never reaches back across one, and a token that is a
breaker on its own is never penalized.

Follows llama.cpp's port of KoboldCpp's implementation (pi6am) exactly:
which tokens count as breakers (`breaker_sequences`: every token whose text
contains a breaker, and every token whose text *ends* with the start of one,
with the rest of the breaker as a token tail), the restart-limit scan, and
the exponent clamp. Only the repeat search differs in method: instead of
the Z-algorithm's Python-level loop, every earlier occurrence of the last
token is extended backwards at once with numpy, one comparison per extra
token of match length, and no further than the length where the penalty
stops growing (llama.cpp clamps the exponent). The cost grows with the
history length, most on a history stuck in a loop (the bench reports it).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from engine.sampling.stages import Stage, StageContext

# llama.cpp's limits on breakers: at most 40 characters (we refuse longer in the settings), and a
# breaker's token tail is cut to 20 tokens.
MAX_TAIL_TOKENS = 20
_FLOAT_MAX_LOG = 88.7228391  # log(FLT_MAX): the exponent clamp, as llama.cpp


class Vocabulary(Protocol):
    """What the chain needs from a tokenizer: turn text into ids and an id into its bytes."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...


Breakers = dict[int, tuple[tuple[int, ...], ...]]  # head token -> the token tails that complete a breaker

# Scanning the vocabulary for breakers takes ~0.1 s at 262k tokens: once per tokenizer and breaker set.
_BREAKER_CACHE: "weakref.WeakKeyDictionary[object, dict[tuple[tuple[str, ...], int], Breakers]]" = (
    weakref.WeakKeyDictionary()
)


def vocabulary_words(vocab: Vocabulary, n_vocab: int) -> list[bytes]:
    return [vocab.token_bytes(i) for i in range(n_vocab)]


class _VocabIndex:
    """The vocabulary's texts, indexed for the two questions the breaker scan asks of every breaker.

    Asked naively (a Python pass over the vocabulary per breaker and per prefix of it) 64 breakers of 40
    characters took 71 s before the first token on a 49k vocabulary, 1,000 short ones a minute (issue 43).
    Here "which tokens contain b" is numpy over all the texts joined (candidates where b's first byte is,
    narrowed byte by byte), and "which tokens end with b[:j]" is a table per suffix length, built once per
    tokenizer and length (at most 39: breakers are at most 40 characters).
    """

    def __init__(self, words: list[bytes]) -> None:
        self.words = words
        self.n = len(words)
        lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=self.n)
        self.starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])).astype(np.int64)
        self.ends = self.starts + lengths  # one past each text's last byte
        self.blob = np.frombuffer(b"\0".join(words), dtype=np.uint8)
        self.by_length: dict[int, list[int]] = {}
        for i, w in enumerate(words):
            self.by_length.setdefault(len(w), []).append(i)
        self._suffixes: dict[int, dict[bytes, np.ndarray]] = {}

    def containing(self, b: bytes) -> np.ndarray:
        """The tokens whose text contains `b` (non-empty), in id order."""
        pos = np.flatnonzero(self.blob == b[0])
        for k in range(1, len(b)):
            pos = pos[pos + k < self.blob.size]
            pos = pos[self.blob[pos + k] == b[k]]
        token = np.searchsorted(self.starts, pos, side="right") - 1
        inside = pos + len(b) <= self.ends[token]  # not across the joining byte (a breaker with a NUL in it)
        return np.unique(token[inside])

    def ending_with(self, head: bytes) -> np.ndarray:
        """The tokens whose text ends with `head` (non-empty), in id order."""
        size = len(head)
        table = self._suffixes.get(size)
        if table is None:
            lists: dict[bytes, list[int]] = {}
            for i in sorted(i for length, group in self.by_length.items() if length >= size for i in group):
                lists.setdefault(self.words[i][-size:], []).append(i)
            table = self._suffixes[size] = {k: np.array(v, dtype=np.int64) for k, v in lists.items()}
        return table.get(head, _NONE)


_NONE = np.zeros(0, dtype=np.int64)
_INDEX_CACHE: "weakref.WeakKeyDictionary[object, dict[int, _VocabIndex]]" = weakref.WeakKeyDictionary()


def _vocab_index(vocab: Vocabulary, n_vocab: int) -> _VocabIndex:
    try:
        per_vocab = _INDEX_CACHE.setdefault(vocab, {})
    except TypeError:  # not weak-referenceable: no cache
        per_vocab = {}
    index = per_vocab.get(n_vocab)
    if index is None:
        index = per_vocab[n_vocab] = _VocabIndex(vocabulary_words(vocab, n_vocab))
    return index


def breaker_sequences(vocab: Vocabulary, breakers: Sequence[str], n_vocab: int) -> Breakers:
    """llama.cpp's `get_overlapping_token_sequences` for every breaker, merged (cached per tokenizer)."""
    key = (tuple(breakers), n_vocab)
    try:
        per_vocab = _BREAKER_CACHE.setdefault(vocab, {})
    except TypeError:  # not weak-referenceable: no cache
        per_vocab = {}
    if key in per_vocab:
        return per_vocab[key]
    index = _vocab_index(vocab, n_vocab)
    tails: dict[tuple[int, ...], int] = {(): 0}  # each distinct tail, numbered in the order first seen
    ids: list[np.ndarray] = []  # (token, tail) pairs in the order llama.cpp's scan adds them
    tail_ids: list[np.ndarray] = []
    for breaker in dict.fromkeys(breakers):  # a repeated breaker adds nothing
        b = breaker.encode("utf-8")
        if not b:
            continue
        contains = index.containing(b)
        ids.append(contains)
        tail_ids.append(np.zeros(contains.size, dtype=np.int64))
        contained = np.zeros(index.n, dtype=bool)
        contained[contains] = True
        # A token whose text ends with the first j bytes of the breaker starts it; the tail is the
        # tokenization of the rest (llama.cpp walks every occurrence of b[0] in the word; each one
        # that runs to the word's end is such a j).
        for j in range(len(b) - 1, 0, -1):
            enders = index.ending_with(b[:j])
            enders = enders[~contained[enders]]
            if not enders.size:
                continue
            tail = tuple(vocab.encode(b[j:].decode("utf-8", "replace"), add_special_tokens=False)[:MAX_TAIL_TOKENS])
            ids.append(enders)
            tail_ids.append(np.full(enders.size, tails.setdefault(tail, len(tails)), dtype=np.int64))
    out = _group(ids, tail_ids, list(tails))
    per_vocab[key] = out
    return out


def _group(ids: list[np.ndarray], tail_ids: list[np.ndarray], tails: list[tuple[int, ...]]) -> Breakers:
    """token -> its distinct tails, tokens and tails each in the order first added (as llama.cpp's scan)."""
    if not ids:
        return {}
    token = np.concatenate(ids)
    tail = np.concatenate(tail_ids)
    if not token.size:
        return {}
    _, first = np.unique(token * len(tails) + tail, return_index=True)  # each (token, tail) pair once
    first.sort()
    token, tail = token[first], tail[first]
    order = np.argsort(token, kind="stable")  # grouped by token, each group's tails still in order
    token_sorted, tail_sorted = token[order], tail[order]
    cuts = np.flatnonzero(token_sorted[1:] != token_sorted[:-1]) + 1
    groups = {int(g[0]): t for g, t in zip(np.split(token_sorted, cuts), np.split(tail_sorted, cuts))}
    _, seen_at = np.unique(token, return_index=True)
    return {int(t): tuple(tails[k] for k in groups[int(t)].tolist()) for t in token[np.sort(seen_at)]}


def make_dry(
    multiplier: float,
    base: float,
    allowed_length: int,
    penalty_last_n: int,
    breakers: Breakers,
) -> Stage:
    """The DRY stage over `ctx.history`'s last `penalty_last_n` tokens (-1 = all).

    `breakers` comes from `breaker_sequences` (empty: no breakers).
    """
    return dry_stage(make_dry_penalties(multiplier, base, allowed_length, penalty_last_n, breakers))


def dry_stage(penalties: DryPenalties) -> Stage:
    """The numpy stage that takes `penalties`' amounts off a row's tokens."""

    def dry(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        found = penalties(np.asarray(ctx.history, dtype=np.int64), scores.size)
        if found is None:
            return scores
        tokens, penalty = found
        out = scores.copy()
        out[tokens] -= penalty
        return out

    return dry


# What DRY takes off which tokens, from the history alone: (history, vocabulary size) -> (distinct token ids,
# float32 penalties), or None where it takes nothing. The numpy stage applies it to a row on the host, the
# torch chain (engine.sampling.torch_chain) to a row on its device.
DryPenalties = Callable[[np.ndarray, int], "tuple[np.ndarray, np.ndarray] | None"]


def make_dry_penalties(
    multiplier: float,
    base: float,
    allowed_length: int,
    penalty_last_n: int,
    breakers: Breakers,
) -> DryPenalties:
    """DRY's penalties over the history's last `penalty_last_n` tokens (-1 = all); arguments as `make_dry`."""
    max_exponent = int(_FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    heads = np.fromiter(breakers, dtype=np.int64, count=len(breakers))
    single = np.fromiter((t for t, tails in breakers.items() if () in tails), dtype=np.int64)

    def penalties(history: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray] | None:
        h = history
        if penalty_last_n > 0:
            h = h[-penalty_last_n:]
        n = h.size
        if n <= allowed_length:
            return None
        rep_limit = _restart_limit(h, heads, breakers)
        if rep_limit < allowed_length:
            return None
        # Past allowed_length + max_exponent the penalty no longer grows (the exponent is clamped; with base 1
        # it never grows): matching further cannot change it, and on a history stuck in a loop that bound is
        # what keeps the search from growing with the square of the history.
        limit = rep_limit
        if max_exponent > 0:
            limit = min(limit, allowed_length + max_exponent)
        elif base == 1:
            limit = min(limit, max(allowed_length, 1))
        tokens, lengths = _repeats(h, limit, allowed_length)
        keep = lengths >= allowed_length
        tokens, lengths = tokens[keep], lengths[keep]
        if tokens.size == 0:
            return None
        if single.size:
            not_breaker = ~np.isin(tokens, single)
            tokens, lengths = tokens[not_breaker], lengths[not_breaker]
        inside = (tokens >= 0) & (tokens < n_vocab)  # ids outside the vocabulary: ignored
        tokens, lengths = tokens[inside], lengths[inside]
        if tokens.size == 0:
            return None
        # Longest repeat each token would extend: sort by (token, length) and take each token's last.
        order = np.lexsort((lengths, tokens))
        tokens, lengths = tokens[order], lengths[order]
        last = np.flatnonzero(np.append(tokens[1:] != tokens[:-1], True))
        tokens, lengths = tokens[last], lengths[last]
        exps = lengths - allowed_length
        if max_exponent > 0:
            exps = np.minimum(exps, max_exponent)
        # llama.cpp: float multiplier * std::pow(float base, int exponent) (a double), stored as float.
        penalty = (np.float64(np.float32(multiplier)) * np.power(np.float64(np.float32(base)), exps)).astype(np.float32)
        return tokens, penalty

    return penalties


def _restart_limit(h: np.ndarray, heads: np.ndarray, breakers: Breakers) -> int:
    """How far back a repeat may reach: to just after the last complete breaker (llama.cpp step 1)."""
    n = h.size
    if heads.size == 0:
        return n
    rev = h[::-1]
    for found in np.flatnonzero(np.isin(rev, heads)):  # i tokens from the end, most recent first
        i = int(found)
        longest = -1
        for tail in breakers[int(rev[i])]:
            m = len(tail)
            if longest < m <= i and all(tail[o] == rev[i - o - 1] for o in range(m)):
                longest = m
        if longest >= 0:
            return i - longest
    return n


def _repeats(h: np.ndarray, rep_limit: int, allowed_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(next token, repeat length) for every earlier place the history's tail also ends.

    For an end position e < n - 1, the repeat length is how many tokens
    h[..e] and h[..n-1] agree on, read backwards, capped at `rep_limit`; the
    token that followed there, h[e + 1], is the one that would extend the
    repeat now. Occurrences of the last token are extended one token of
    match at a time, all together.
    """
    n = h.size
    ends = np.flatnonzero(h[: n - 1] == h[n - 1])
    lengths = np.ones(ends.size, dtype=np.int64)
    alive = np.arange(ends.size)
    step = 1
    while alive.size and step < rep_limit:
        pos = ends[alive] - step
        ok = pos >= 0
        alive, pos = alive[ok], pos[ok]
        alive = alive[h[pos] == h[n - 1 - step]]
        lengths[alive] += 1
        step += 1
    lengths = np.minimum(lengths, rep_limit)
    if allowed_length == 0:  # every earlier position counts, a repeat of length 0 included (as llama.cpp)
        every = np.zeros(n - 1, dtype=np.int64)
        every[ends] = lengths
        return h[1:], every
    return h[ends + 1], lengths
