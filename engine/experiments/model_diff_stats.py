"""Per-position numbers of two models' next-token distributions, a chunk of positions at a time.

Everything here works on (n, V) float32 blocks, whole chunks at once (a Python
loop over 49k-wide rows would cost more than the models): log-softmax in place,
the text's token's log-prob and rank, entropy, the top N, and between the two
models KL in both directions and the rank of each model's top token under the
other. Ranks count the tokens scored strictly higher, as `SamplerChain.pick`
does (0 = the model's top token), so they equal `Engine.score`'s.

One exp per row gives both the log-probs and the probabilities; the top N is
selected among the best blocks of each row (`top_k`), not the whole row; sums
of products go through einsum (no (n, V) temporary). KL from float32 log-probs
carries ~1e-6 nats of rounding, far below what a Q4 model differs from its
float original by (~1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _row_dots(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) sums of x * y per row without an (n, V) temporary (einsum; float32 sums of 49k terms are good to
    ~1e-6 of the terms' total here, far below the 1e-4 two llama.cpp contexts differ by)."""
    return np.einsum("ij,ij->i", x, y).astype(np.float64)


TOP_BLOCK = 1024  # columns per block in `top_k`'s first pass


def top_k(lp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, k) ids and values of each row's k largest, best first.

    A row's k largest lie in the k blocks (of TOP_BLOCK columns) with the largest maxima: a block holding
    one of them has a maximum at least that large, and at most k - 1 other blocks can beat it. So the
    selection runs on k blocks per row (10 of 48 at a 49k vocabulary) instead of the whole row.
    """
    n, v = lp.shape
    if v % TOP_BLOCK or v // TOP_BLOCK <= k:
        part = np.argpartition(lp, v - k, axis=1)[:, -k:]
    else:
        blocks = lp.reshape(n, v // TOP_BLOCK, TOP_BLOCK)
        best_blocks = np.argpartition(blocks.max(axis=2), -k, axis=1)[:, -k:]  # (n, k)
        cand = np.take_along_axis(blocks, best_blocks[:, :, None], axis=1).reshape(n, k * TOP_BLOCK)
        inner = np.argpartition(cand, cand.shape[1] - k, axis=1)[:, -k:]  # positions within the candidates
        part = best_blocks[np.arange(n)[:, None], inner // TOP_BLOCK] * TOP_BLOCK + inner % TOP_BLOCK
    vals = np.take_along_axis(lp, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


def softmax_(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, V) logits -> (log-probs, probs); the log-probs overwrite `block`, one exp for both."""
    block -= block.max(axis=1, keepdims=True)  # (n, V) z = x - max
    e = np.exp(block)
    total = e.sum(axis=1, keepdims=True, dtype=np.float64)
    e /= total.astype(np.float32)
    block -= np.log(total).astype(np.float32)
    return block, e


@dataclass
class OwnStats:
    """One model's numbers over a chunk of n positions (computed on its own worker thread)."""

    logprobs: np.ndarray  # (n, V) log-probs (the chunk, normalised in place)
    probs: np.ndarray  # (n, V) exp(logprobs): the other side's KL needs them
    token_logprob: np.ndarray  # (n,)
    rank: np.ndarray  # (n,) int
    entropy: np.ndarray  # (n,) nats
    best: np.ndarray  # (n,) the top token's id
    top_ids: np.ndarray  # (n, k) best first
    top_logprobs: np.ndarray  # (n, k)


def own_stats(block: np.ndarray, targets: np.ndarray, top_n: int) -> OwnStats:
    """A model's own numbers for the (n, V) logits `block` whose row j predicts `targets[j]`."""
    lp, p = softmax_(block)
    rows = np.arange(lp.shape[0])
    token_lp = lp[rows, targets]
    rank = np.count_nonzero(lp > token_lp[:, None], axis=1)
    entropy = -_row_dots(p, lp)
    for i in np.flatnonzero(np.isnan(entropy)):  # a -inf log-prob: 0 * -inf is NaN in the fast sum, 0 here
        keep = p[i] > 0
        entropy[i] = -float(np.sum(p[i][keep].astype(np.float64) * lp[i][keep]))
    top_ids, top_lp = top_k(lp, max(1, min(top_n, lp.shape[1])))
    best = top_ids[:, 0].copy()
    return OwnStats(lp, p, token_lp, rank, entropy, best, top_ids[:, :top_n], top_lp[:, :top_n])


@dataclass
class CrossStats:
    """What needs both models' rows: KL both ways, and each one's top token ranked by the other."""

    kl_ab: np.ndarray  # (n,) KL(A || B) = sum_v pA (log pA - log pB), nats
    kl_ba: np.ndarray  # (n,) KL(B || A)
    a_top_rank_in_b: np.ndarray  # (n,) rank under B of A's top token
    b_top_rank_in_a: np.ndarray  # (n,)


def _kl_row(p: np.ndarray, lp: np.ndarray, lq: np.ndarray) -> float:
    """KL(p || q) of one row where infinities are about: terms with p = 0 count 0, p > 0 with q = 0 give inf."""
    keep = p > 0
    return float(np.sum(p[keep].astype(np.float64) * (lp[keep].astype(np.float64) - lq[keep])))


def cross_stats(a: OwnStats, b: OwnStats) -> CrossStats:
    """KL between the two chunks' rows and the top tokens' cross ranks (run on B's worker thread)."""
    diff = a.logprobs - b.logprobs  # (n, V) log pA - log pB
    kl_ab = _row_dots(a.probs, diff)
    kl_ba = -_row_dots(b.probs, diff)
    for kl, p, lp, lq in ((kl_ab, a.probs, a.logprobs, b.logprobs), (kl_ba, b.probs, b.logprobs, a.logprobs)):
        for i in np.flatnonzero(~np.isfinite(kl)):  # an -inf log-prob somewhere: 0 * inf is NaN in the fast sum
            kl[i] = _kl_row(p[i], lp[i], lq[i])
    rows = np.arange(diff.shape[0])
    a_top_in_b = np.count_nonzero(b.logprobs > b.logprobs[rows, a.best][:, None], axis=1)
    b_top_in_a = np.count_nonzero(a.logprobs > a.logprobs[rows, b.best][:, None], axis=1)
    # Rounding can leave a KL of identical rows a hair below 0; it is 0.
    return CrossStats(np.maximum(kl_ab, 0.0), np.maximum(kl_ba, 0.0), a_top_in_b, b_top_in_a)
