"""Each sampler stage against transformers' warpers and mlx-lm's `apply_*` as oracles.

The oracles get the very same float32 numbers (torch tensors / mlx arrays made
from our numpy rows); a stage matches when the same tokens survive and the
surviving scores agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from engine.sampling import stages
from engine.sampling.stages import (
    StageContext,
    keep_only,
    make_min_p,
    make_penalties,
    make_temperature,
    make_top_k,
    make_top_p,
    make_typical_p,
    make_xtc,
)

NEG_INF = np.float32(-np.inf)


def ctx(history=(), seed: int = 0) -> StageContext:
    return StageContext(np.asarray(history, dtype=np.int64), np.random.default_rng(seed))


def rows(v: int, n: int = 6, seed: int = 0) -> list[np.ndarray]:
    """Random float32 rows of several shapes: flat, spread, peaked, with masked (-inf) tokens."""
    rng = np.random.default_rng(seed + v)
    out = []
    for i in range(n):
        scale = (0.3, 1.0, 3.0, 8.0)[i % 4]
        x = (rng.standard_normal(v) * scale).astype(np.float32)
        if i % 3 == 2 and v > 4:
            x[rng.choice(v, size=3, replace=False)] += 12.0  # a few strong candidates
        if i % 4 == 3 and v > 4:
            x[rng.choice(v, size=v // 5, replace=False)] = NEG_INF  # already filtered
        out.append(x)
    return out


def hf(processor, x: np.ndarray, input_ids=None) -> np.ndarray:
    ids = torch.zeros((1, 0), dtype=torch.long) if input_ids is None else torch.as_tensor(np.asarray(input_ids)).long()[None]
    return processor(ids, torch.from_numpy(x.copy())[None]).numpy()[0]


def assert_same(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-6, atol: float = 1e-6) -> None:
    fin_o, fin_t = np.isfinite(ours), np.isfinite(theirs)
    diff = np.flatnonzero(fin_o != fin_t)
    assert diff.size == 0, f"survivors differ at {diff[:10]} (ours finite: {fin_o[diff[:10]]})"
    np.testing.assert_allclose(ours[fin_o], theirs[fin_t], rtol=rtol, atol=atol)
    assert ours.dtype == np.float32


def assert_same_cut(ours: np.ndarray, theirs: np.ndarray, x: np.ndarray, p: float, typical: bool) -> None:
    """`assert_same` for a stage that keeps the smallest set of tokens reaching mass p (top-p, typical-p),
    except for a token at the cut where the mass before it is within float rounding of p.

    transformers sums the mass in float32 and we in float64: over thousands of tokens the sums differ by
    ~1e-7, so where the mass before a token is that close to p, one side keeps it and the other does not
    (seen: 0.99899995 before a token of p = 0.999, on an AVX2 CPU only). Every other token must agree.
    """
    differ = np.flatnonzero(np.isfinite(ours) != np.isfinite(theirs))
    if differ.size:
        finite = np.isfinite(x)
        x64 = np.where(finite, x.astype(np.float64), -np.inf)
        logp = x64 - (x64[finite].max() + np.log(np.exp(x64[finite] - x64[finite].max()).sum()))
        prob = np.exp(logp)
        entropy = -(prob[finite] * logp[finite]).sum()
        key = np.where(finite, np.abs(-logp - entropy), np.inf) if typical else -x64  # the stage's order
        order = np.argsort(key, kind="stable")
        mass_before = dict(zip(order.tolist(), (np.cumsum(prob[order]) - prob[order]).tolist()))
        assert all(abs(mass_before[int(t)] - p) <= 1e-6 for t in differ), [mass_before[int(t)] for t in differ]
        ours, theirs = ours.copy(), theirs.copy()
        ours[differ] = theirs[differ] = NEG_INF
    assert_same(ours, theirs)


VOCABS = [1, 2, 7, 100, 3000]


# ---------------------------------------------------------------- temperature


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("t", [0.05, 0.7, 1.0, 1.3, 5.0])
def test_temperature_matches_transformers(v, t):
    for x in rows(v):
        assert_same(make_temperature(t)(x, ctx()), hf(TemperatureLogitsWarper(t), x))


def test_temperature_zero_is_the_chains_business():
    with pytest.raises(ValueError, match="greedy"):
        make_temperature(0.0)


# ---------------------------------------------------------------------- top-k


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("k", [1, 2, 5, 50, 99, 100, 101, 10_000])
def test_top_k_matches_transformers(v, k):
    for x in rows(v):
        assert_same(make_top_k(k)(x, ctx()), hf(TopKLogitsWarper(k), x))


@pytest.mark.parametrize("k", [1, 3, 4, 10])
def test_top_k_keeps_every_tie_like_transformers(k):
    x = np.array([5, 3, 3, 3, 1, 1, 0, 5, -2, 3], dtype=np.float32)
    ours = make_top_k(k)(x, ctx())
    assert_same(ours, hf(TopKLogitsWarper(k), x))
    kth = np.sort(x)[::-1][k - 1]
    assert set(np.flatnonzero(np.isfinite(ours))) == set(np.flatnonzero(x >= kth))


def test_top_k_zero_and_large_k_change_nothing():
    x = rows(50)[0]
    assert make_top_k(0)(x, ctx()) is x
    assert make_top_k(50)(x, ctx()) is x
    assert make_top_k(51)(x, ctx()) is x


# ---------------------------------------------------------------------- top-p


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("p", [1e-9, 0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999999, 1.0])
def test_top_p_matches_transformers(v, p):
    for x in rows(v):
        assert_same_cut(make_top_p(p)(x, ctx()), hf(TopPLogitsWarper(p), x), x, p, typical=False)


def test_top_p_tiny_p_keeps_only_the_top_token():
    for x in rows(3000):
        out = make_top_p(1e-12)(x, ctx())
        assert np.flatnonzero(np.isfinite(out)).tolist() == [int(np.argmax(x))]


def test_top_p_keeps_all_ties_at_the_cut():
    # Four equally likely tokens and p = 0.3: the cut falls inside the tie.
    # transformers keeps whichever tied tokens its sort put last; we keep all.
    x = np.array([0, 0, 0, 0, -10, -10], dtype=np.float32)
    ours = make_top_p(0.3)(x, ctx())
    theirs = hf(TopPLogitsWarper(0.3), x)
    assert np.flatnonzero(np.isfinite(ours)).tolist() == [0, 1, 2, 3]
    assert set(np.flatnonzero(np.isfinite(theirs))) <= {0, 1, 2, 3}


def test_top_p_grows_its_head_into_a_heavy_tail():
    # One strong token and 100k weak ones 10 nats below that hold most of the mass:
    # the first reaches (4, 8 nats) are too short, the head must grow.
    # transformers' float32 cumsum over 100k terms drifts by about one token's
    # mass here, so the oracle is the same rule in float64 (and transformers
    # must agree up to a token or two at the cut).
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_001) * 0.05 - 10.0).astype(np.float32)
    x[123] = 0.0
    for p in (0.1, 0.5, 0.9, 0.999):
        ours = make_top_p(p)(x, ctx())
        order = np.argsort(-x.astype(np.float64), kind="stable")
        w = np.exp(x.astype(np.float64)[order] - x.max())
        before = np.concatenate([[0.0], np.cumsum(w)[:-1]]) / w.sum()  # mass before each token
        cut = x[order[before < p]].min()  # 100k draws in float32 tie often: ties at the cut stay
        assert np.flatnonzero(np.isfinite(ours)).tolist() == np.flatnonzero(x >= cut).tolist()
        theirs = hf(TopPLogitsWarper(p), x)
        assert np.count_nonzero(np.isfinite(ours) != np.isfinite(theirs)) <= 3


@pytest.mark.parametrize("p", [0.3, 0.9, 0.999])
def test_top_p_and_typical_p_fallback_to_a_full_sort(monkeypatch, p):
    monkeypatch.setattr(stages, "_TOP_P_REACH", ())
    monkeypatch.setattr(stages, "_TYPICAL_REACH", ())
    for x in rows(3000):
        assert_same_cut(make_top_p(p)(x, ctx()), hf(TopPLogitsWarper(p), x), x, p, typical=False)
        assert_same_cut(make_typical_p(p)(x, ctx()), hf(TypicalLogitsWarper(p), x), x, p, typical=True)


# ---------------------------------------------------------------------- min-p


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("p", [1e-6, 0.01, 0.05, 0.1, 0.3, 0.9, 1.0])
def test_min_p_matches_transformers(v, p):
    for x in rows(v):
        assert_same(make_min_p(p)(x, ctx()), hf(MinPLogitsWarper(p), x))


def test_min_p_one_keeps_the_top_ties():
    x = np.array([1, 4, 4, 2], dtype=np.float32)
    assert np.flatnonzero(np.isfinite(make_min_p(1.0)(x, ctx()))).tolist() == [1, 2]


# ------------------------------------------------------------------ typical-p


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("p", [1e-6, 0.2, 0.5, 0.9, 0.95, 0.999])
def test_typical_p_matches_transformers(v, p):
    for x in rows(v):
        assert_same_cut(make_typical_p(p)(x, ctx()), hf(TypicalLogitsWarper(p), x), x, p, typical=True)


def test_typical_p_can_drop_the_most_likely_token():
    # Entropy ~1.09 nats; the 0.3 tokens (surprise 1.20) are more typical than
    # the 0.4 one (surprise 0.92), and together they already hold mass 0.6.
    x = np.log(np.array([0.4, 0.3, 0.3], dtype=np.float32))
    out = make_typical_p(0.5)(x, ctx())
    assert np.flatnonzero(np.isfinite(out)).tolist() == [1, 2]
    assert_same(out, hf(TypicalLogitsWarper(0.5), x))


# ---------------------------------------------------------------- penalties


def _histories(v: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [
        np.array([], dtype=np.int64),
        rng.integers(0, v, size=1),
        rng.integers(0, v, size=40),
        rng.integers(0, min(v, 5), size=30),  # many repeats
        np.concatenate([rng.integers(0, v, size=10), [v, v + 7, -1]]),  # ids outside the vocab are ignored
    ]


@pytest.mark.parametrize("v", [2, 100, 3000])
@pytest.mark.parametrize("penalty", [0.5, 1.1, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(v, penalty):
    rng = np.random.default_rng(v)
    for x in rows(v):
        for hist in _histories(v, rng):
            ours = make_penalties(penalty, 0.0, 0.0, -1)(x, ctx(hist))
            # transformers has no window and does not clamp negative ids: feed it the valid ones.
            valid = hist[(hist >= 0) & (hist < v)]
            assert_same(ours, hf(RepetitionPenaltyLogitsProcessor(penalty), x, valid))


@pytest.mark.parametrize("last_n", [1, 3, 16])
def test_repetition_penalty_window(last_n):
    rng = np.random.default_rng(1)
    x = rows(200)[1]
    hist = rng.integers(0, 200, size=50)
    ours = make_penalties(1.5, 0.0, 0.0, last_n)(x, ctx(hist))
    assert_same(ours, hf(RepetitionPenaltyLogitsProcessor(1.5), x, hist[-last_n:]))


def _openai_reference(x, hist, presence, frequency):
    out = x.astype(np.float64)
    ids, counts = np.unique(hist, return_counts=True)
    for i, c in zip(ids, counts):
        out[i] -= presence + frequency * c
    return out.astype(np.float32)


@pytest.mark.parametrize("presence,frequency", [(0.5, 0.0), (0.0, 0.3), (0.7, 0.2), (-1.0, 0.5), (2.0, -2.0)])
def test_presence_and_frequency_penalties_are_openai_style(presence, frequency):
    rng = np.random.default_rng(3)
    for x in rows(300):
        hist = rng.integers(0, 20, size=60)  # repeats, so counts matter
        ours = make_penalties(1.0, presence, frequency, -1)(x, ctx(hist))
        assert_same(ours, _openai_reference(x, hist, presence, frequency), rtol=1e-6, atol=1e-5)


def test_penalties_apply_repetition_before_the_additive_ones():
    x = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    out = make_penalties(2.0, 0.5, 0.25, -1)(x, ctx([0, 0, 1]))
    np.testing.assert_allclose(out, [2.0 / 2 - 0.5 - 0.5, -2.0 * 2 - 0.5 - 0.25, 1.0])


def test_penalties_off_or_empty_history_change_nothing():
    x = rows(30)[0]
    assert make_penalties(1.3, 0.2, 0.1, 0)(x, ctx([1, 2, 3])) is x  # last_n = 0: off
    assert make_penalties(1.0, 0.0, 0.0, -1)(x, ctx([1, 2, 3])) is x
    assert make_penalties(1.3, 0.0, 0.0, 64)(x, ctx([])) is x


def test_penalties_leave_filtered_tokens_filtered():
    x = np.array([NEG_INF, 1.0, NEG_INF], dtype=np.float32)
    out = make_penalties(1.5, -2.0, -2.0, -1)(x, ctx([0, 0, 1, 2]))
    assert np.isneginf(out[0]) and np.isneginf(out[2]) and np.isfinite(out[1])


# ---------------------------------------------------------------------- XTC


def _xtc_reference(x: np.ndarray, threshold: float) -> np.ndarray:
    """text-generation-webui's rule, written plainly in float64."""
    p = np.exp(x.astype(np.float64) - x.max())
    p /= p.sum()
    above = np.flatnonzero(p >= threshold)
    out = x.copy()
    if above.size >= 2:
        least = p[above].min()
        out[above[p[above] > least]] = NEG_INF
    return out


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("threshold", [0.01, 0.1, 0.2, 0.5])
def test_xtc_always_on_matches_reference(v, threshold):
    for x in rows(v):
        assert_same(make_xtc(1.0, threshold)(x, ctx()), _xtc_reference(x, threshold))


def test_xtc_removes_top_choices_but_keeps_the_least_likely_viable_one():
    x = np.log(np.array([0.4, 0.3, 0.2, 0.05, 0.05], dtype=np.float32))
    out = make_xtc(1.0, 0.15)(x, ctx())
    assert np.flatnonzero(np.isfinite(out)).tolist() == [2, 3, 4]
    # Only one token above the threshold: nothing to exclude.
    y = np.log(np.array([0.7, 0.1, 0.1, 0.1], dtype=np.float32))
    assert make_xtc(1.0, 0.2)(y, ctx()) is y


def test_xtc_fires_with_its_probability_on_one_draw_per_step():
    x = np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32))
    stage = make_xtc(0.3, 0.1)
    c = ctx(seed=7)
    twin = np.random.default_rng(7)
    fired = []
    for _ in range(300):
        out = stage(x, c)
        expected = twin.random() < 0.3  # exactly one draw per call, fired or not
        fired.append(not np.isfinite(out[0]))
        assert fired[-1] == expected
    assert 0.2 < np.mean(fired) < 0.4


# ------------------------------------------------------------ common contract


ALL_STAGES = {
    "temperature": make_temperature(0.7),
    "top_k": make_top_k(5),
    "top_p": make_top_p(0.8),
    "min_p": make_min_p(0.1),
    "typical_p": make_typical_p(0.7),
    "xtc": make_xtc(1.0, 0.05),
    "penalties": make_penalties(1.3, 0.4, 0.2, 8),
}


@pytest.mark.parametrize("name", sorted(ALL_STAGES))
def test_stages_do_not_mutate_their_input_and_keep_float32(name):
    for x in rows(500):
        before = x.copy()
        out = ALL_STAGES[name](x, ctx(np.arange(0, 500, 7)))
        np.testing.assert_array_equal(x, before)
        assert out.dtype == np.float32 and out.shape == x.shape
        assert np.isfinite(out).any()


def test_keep_only_dense_and_sparse_paths_agree():
    x = rows(1000)[1]
    for frac in (0.01, 0.5, 0.99, 1.0):
        keep = np.random.default_rng(0).random(1000) < frac
        out = keep_only(x, keep)
        np.testing.assert_array_equal(np.isfinite(out), keep & np.isfinite(x))
        np.testing.assert_array_equal(out[keep], x[keep])


def test_factories_reject_out_of_range_settings():
    for bad in (lambda: make_top_k(-1), lambda: make_top_p(0.0), lambda: make_top_p(1.5), lambda: make_min_p(-0.1),
                lambda: make_typical_p(0.0), lambda: make_xtc(1.5, 0.1), lambda: make_penalties(0.0, 0, 0, 8),
                lambda: make_penalties(1.1, 0, 0, -2)):
        with pytest.raises(ValueError):
            bad()


# ------------------------------------------------------------ mlx-lm oracles


@pytest.fixture(scope="module")
def mlx_sample_utils():
    mx = pytest.importorskip("mlx.core")
    su = pytest.importorskip("mlx_lm.sample_utils")
    return mx, su


def _logprobs(x: np.ndarray) -> np.ndarray:
    """mlx-lm's samplers take log-probabilities: log_softmax in float32."""
    m = x.max()
    return (x - m - np.log(np.exp(x - m).sum(dtype=np.float64))).astype(np.float32)


def _mlx(mx, fn, lp: np.ndarray, *args) -> np.ndarray:
    return np.array(fn(mx.array(lp), *args))


def _survivors(a: np.ndarray) -> list[int]:
    return np.flatnonzero(np.isfinite(a)).tolist()


@pytest.mark.mlx
@pytest.mark.parametrize("v", [7, 100, 3000])
@pytest.mark.parametrize("k", [1, 2, 5, -1])
def test_top_k_matches_mlx_lm(mlx_sample_utils, v, k):
    mx, su = mlx_sample_utils
    k = k % v  # mlx-lm's apply_top_k requires 0 < k < V; -1 -> V - 1
    for x in rows(v)[:3]:  # mlx-lm's argpartition picks arbitrarily among ties: no -inf rows
        assert _survivors(make_top_k(k)(x, ctx())) == _survivors(_mlx(mx, su.apply_top_k, _logprobs(x), k))


@pytest.mark.mlx
@pytest.mark.parametrize("v", [7, 100, 3000])
@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_matches_mlx_lm(mlx_sample_utils, v, p):
    mx, su = mlx_sample_utils
    for x in rows(v):
        assert _survivors(make_top_p(p)(x, ctx())) == _survivors(_mlx(mx, su.apply_top_p, _logprobs(x), p))


@pytest.mark.mlx
@pytest.mark.parametrize("v", [7, 100, 3000])
@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 1.0])
def test_min_p_matches_mlx_lm(mlx_sample_utils, v, p):
    mx, su = mlx_sample_utils
    for x in rows(v):
        assert _survivors(make_min_p(p)(x, ctx())) == _survivors(_mlx(mx, su.apply_min_p, _logprobs(x), p))


@pytest.mark.mlx
@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.3])
def test_xtc_matches_mlx_lm_when_always_on(mlx_sample_utils, threshold):
    mx, su = mlx_sample_utils
    for x in rows(100):
        theirs = _mlx(mx, su.apply_xtc, x, 1.0, threshold, [])
        assert _survivors(make_xtc(1.0, threshold)(x, ctx())) == _survivors(theirs)
