"""Per-position numbers of two models' next-token distributions, a chunk of positions at a time.

Everything here works on (n, V) float32 blocks, whole chunks at once (a Python
loop over 49k-wide rows would cost more than the models): log-softmax in place,
the text's token's log-prob and rank, entropy, the top N, and between the two
models KL in both directions and the rank of each model's top token under the
other. Ranks count the tokens scored strictly higher, as `SamplerChain.pick`
does (0 = the model's top token), so they equal `Engine.score`'s.

KL is summed in float64 over float32 terms: at a KL of 0.01 nats (a Q4 model
against its float original) float32 log-probs leave ~1e-6 of rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _row_sums(terms: np.ndarray) -> np.ndarray:
    """(n,) float64 sums of the (n, V) float32 `terms` rows (float64 accumulator, no float64 copy of the block)."""
    return terms.sum(axis=1, dtype=np.float64)


def log_softmax_(block: np.ndarray) -> np.ndarray:
    """(n, V) logits -> log-probs, in place (the caller's block is overwritten and returned)."""
    block -= block.max(axis=1, keepdims=True)
    lse = np.log(np.exp(block).sum(axis=1, keepdims=True, dtype=np.float64)).astype(np.float32)
    block -= lse
    return block


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
    lp = log_softmax_(block)
    rows = np.arange(lp.shape[0])
    token_lp = lp[rows, targets]
    rank = np.count_nonzero(lp > token_lp[:, None], axis=1)
    p = np.exp(lp)
    entropy = -_row_sums(p * lp)
    for i in np.flatnonzero(np.isnan(entropy)):  # a -inf log-prob: 0 * -inf is NaN in the fast sum, 0 here
        keep = p[i] > 0
        entropy[i] = -float(np.sum(p[i][keep].astype(np.float64) * lp[i][keep]))
    best = lp.argmax(axis=1)
    k = max(0, min(top_n, lp.shape[1]))
    if k:
        part = np.argpartition(lp, lp.shape[1] - k, axis=1)[:, -k:]  # (n, k) unordered
        vals = np.take_along_axis(lp, part, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        top_ids, top_lp = np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)
    else:
        top_ids, top_lp = np.zeros((lp.shape[0], 0), dtype=np.int64), np.zeros((lp.shape[0], 0), dtype=np.float32)
    return OwnStats(lp, p, token_lp, rank, entropy, best, top_ids, top_lp)


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
    kl_ab = _row_sums(a.probs * diff)
    kl_ba = -_row_sums(b.probs * diff)
    for kl, p, lp, lq in ((kl_ab, a.probs, a.logprobs, b.logprobs), (kl_ba, b.probs, b.logprobs, a.logprobs)):
        for i in np.flatnonzero(~np.isfinite(kl)):  # an -inf log-prob somewhere: 0 * inf is NaN in the fast sum
            kl[i] = _kl_row(p[i], lp[i], lq[i])
    rows = np.arange(diff.shape[0])
    a_top_in_b = np.count_nonzero(b.logprobs > b.logprobs[rows, a.best][:, None], axis=1)
    b_top_in_a = np.count_nonzero(a.logprobs > a.logprobs[rows, b.best][:, None], axis=1)
    # Rounding can leave a KL of identical rows a hair below 0; it is 0.
    return CrossStats(np.maximum(kl_ab, 0.0), np.maximum(kl_ba, 0.0), a_top_in_b, b_top_in_a)
