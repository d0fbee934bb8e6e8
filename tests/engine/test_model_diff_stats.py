"""The per-chunk numbers of a two-model comparison (engine/experiments/model_diff_stats.py) against plain
float64 numpy on random logits: log-probs, ranks, entropy, the top N (the block-wise selection), KL both ways."""

from __future__ import annotations

import numpy as np
import pytest

from engine.experiments.model_diff_stats import cross_stats, own_stats, top_k


def _logits(seed: int, n: int = 24, v: int = 8192, scale: float = 4.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, v)) * scale).astype(np.float32)


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


@pytest.mark.parametrize("v", [8192, 5000])  # blocks of 1024, and a width the block selection does not take
def test_top_k_is_the_k_largest_best_first(v):
    x = _logits(1, v=v)
    x[3, 100:140] = 50.0  # ties, all in one block
    x[4, ::1024] = 30.0  # one winner in every block
    ids, vals = top_k(x, 10)
    for r in range(x.shape[0]):
        want = np.sort(x[r])[::-1][:10]
        assert np.array_equal(vals[r], want)
        assert np.array_equal(x[r, ids[r]], vals[r]) and len(set(ids[r].tolist())) == 10


def test_own_and_cross_stats_match_float64_numpy():
    xa, xb = _logits(2), _logits(3) * 0.3 + _logits(2) * 0.8  # related but different distributions
    xb[5] = xa[5]  # one row identical: KL 0
    targets = np.random.default_rng(4).integers(0, xa.shape[1], xa.shape[0])
    la, lb = _log_softmax64(xa), _log_softmax64(xb)
    sa, sb = own_stats(xa.copy(), targets, 5), own_stats(xb.copy(), targets, 5)
    cross = cross_stats(sa, sb)
    rows = np.arange(xa.shape[0])
    np.testing.assert_allclose(sa.token_logprob, la[rows, targets], atol=1e-5)
    assert np.array_equal(sa.rank, np.count_nonzero(la > la[rows, targets][:, None], axis=1))
    np.testing.assert_allclose(sa.entropy, -(np.exp(la) * la).sum(axis=1), rtol=1e-5)
    kl_ab = (np.exp(la) * (la - lb)).sum(axis=1)
    kl_ba = (np.exp(lb) * (lb - la)).sum(axis=1)
    np.testing.assert_allclose(cross.kl_ab, kl_ab, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cross.kl_ba, kl_ba, rtol=1e-4, atol=1e-6)
    assert cross.kl_ab[5] == pytest.approx(0.0, abs=1e-6) and (cross.kl_ab >= 0).all()
    assert np.array_equal(cross.a_top_rank_in_b, np.count_nonzero(lb > lb[rows, la.argmax(1)][:, None], axis=1))
    assert np.array_equal(sa.top_ids[:, 0], la.argmax(1)) and sa.top_ids.shape == (xa.shape[0], 5)


def test_a_removed_token_gives_finite_entropy_and_an_infinite_kl_only_one_way():
    xa, xb = _logits(5, n=2), _logits(6, n=2)
    xb[0, 7] = -np.inf  # B rules out a token A gives some probability
    sa, sb = own_stats(xa.copy(), np.array([1, 2]), 3), own_stats(xb.copy(), np.array([1, 2]), 3)
    cross = cross_stats(sa, sb)
    assert np.isfinite(sb.entropy).all()
    assert cross.kl_ab[0] == np.inf and np.isfinite(cross.kl_ba[0])
