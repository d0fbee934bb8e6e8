"""Properties of the sampler chain on arbitrary rows and settings (hypothesis)."""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from engine.sampling import STAGE_NAMES, SamplerChain, SamplerSettings
from engine.sampling.stages import StageContext, make_min_p, make_top_k, make_top_p

# SAMPLING_EXAMPLES=2000 for a longer hunt; the suite stays fast with 60.
FAST = settings(max_examples=int(os.environ.get("SAMPLING_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])



@st.composite
def rows(draw, min_v: int = 1, max_v: int = 300):
    """float32 logits, some exactly tied, some already masked (-inf), at least one finite."""
    v = draw(st.integers(min_v, max_v))
    x = draw(arrays(np.float32, v, elements=st.floats(-30, 30, width=32)))
    if v > 1 and draw(st.booleans()):
        x = np.round(x)  # many ties
    if v > 1 and draw(st.booleans()):
        masked = draw(arrays(np.bool_, v))
        masked[draw(st.integers(0, v - 1))] = False
        x = np.where(masked, np.float32(-np.inf), x).astype(np.float32)
    return x


@st.composite
def sampler_settings(draw, greedy: bool | None = None):
    if greedy is None:
        greedy = draw(st.booleans())
    order = draw(st.permutations(STAGE_NAMES))
    order = tuple(n for n in order if draw(st.integers(0, 5)) > 0)  # sometimes leave stages out
    return SamplerSettings(
        temperature=0.0 if greedy else draw(st.floats(0.05, 5.0)),
        top_k=draw(st.sampled_from([0, 0, 1, 2, 5, 40, 1000])),
        top_p=draw(st.sampled_from([1.0, 1.0, 0.999, 0.9, 0.5, 1e-6])),
        min_p=draw(st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.5, 1.0])),
        typical_p=draw(st.sampled_from([1.0, 1.0, 0.95, 0.5])),
        repetition_penalty=draw(st.sampled_from([1.0, 1.0, 1.3, 0.8])),
        presence_penalty=draw(st.sampled_from([0.0, 0.5, -0.5])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.3])),
        penalty_last_n=draw(st.sampled_from([-1, 0, 4, 64])),
        xtc_probability=draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
        xtc_threshold=draw(st.sampled_from([0.05, 0.1, 0.5])),
        seed=draw(st.integers(0, 2**63 - 1)),
        order=order,
    )


def history_for(x: np.ndarray, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, x.size, size=20)


def reference(x: np.ndarray) -> tuple[np.ndarray, float]:
    """float64 log-softmax and entropy, written plainly."""
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64)
    m = x64[fin].max()
    lse = m + math.log(np.exp(x64[fin] - m).sum())
    lp = x64 - lse
    p = np.exp(lp[fin])
    return lp, float(-(p * lp[fin]).sum())


@FAST
@given(rows(), sampler_settings(greedy=False), st.booleans())
def test_final_probabilities_sum_to_one(x, s, record):
    pick = SamplerChain(s).pick(x, history_for(x), top_n=x.size, record_stages=record)
    assert math.isclose(math.fsum(p.prob for p in pick.top_sampler), 1.0, abs_tol=1e-5)
    assert pick.token_id in {p.token_id for p in pick.top_sampler}
    assert math.isclose(math.fsum(p.prob for p in pick.top_model), 1.0, abs_tol=1e-5)


@FAST
@given(rows(), st.sampled_from(["top_k", "top_p", "min_p"]), st.data())
def test_these_filters_never_drop_the_most_likely_token(x, name, data):
    make = {"top_k": make_top_k, "top_p": make_top_p, "min_p": make_min_p}[name]
    arg = data.draw(
        {"top_k": st.integers(1, 400), "top_p": st.floats(1e-9, 1.0), "min_p": st.floats(0.0, 1.0)}[name]
    )
    out = make(arg)(x, StageContext(np.zeros(0, np.int64), np.random.default_rng(0)))
    best = np.flatnonzero(x == x.max())
    assert np.all(np.isfinite(out[best])), "every token tied for the top survives"
    assert np.all(out[np.isfinite(out)] == x[np.isfinite(out)]), "survivors keep their scores"


@FAST
@given(rows(), sampler_settings(greedy=False))
def test_without_penalties_or_xtc_the_models_favourite_survives(x, s):
    s = s.with_(order=tuple(n for n in s.order if n not in ("penalties", "xtc", "typical_p")))
    pick = SamplerChain(s).pick(x, history_for(x), top_n=x.size)
    assert int(np.argmax(x)) in {p.token_id for p in pick.top_sampler}


@FAST
@given(rows(), sampler_settings(greedy=True), st.booleans())
def test_greedy_is_the_argmax(x, s, record):
    chain = SamplerChain(s.with_(order=tuple(n for n in s.order if n not in ("penalties", "xtc", "typical_p"))))
    pick = chain.pick(x, history_for(x), record_stages=record)
    assert pick.token_id == int(np.argmax(x))  # the first of any tied maxima
    assert pick.rank == 0 and pick.sampler_logprob == 0.0


@FAST
@given(st.lists(rows(min_v=5, max_v=60), min_size=1, max_size=8), sampler_settings(), st.booleans())
def test_same_seed_same_tokens(seq, s, record):
    v = min(x.size for x in seq)
    seq = [x[:v] if np.isfinite(x[:v]).any() else np.zeros(v, np.float32) for x in seq]
    hist = np.arange(v) % 7

    def run():
        chain = SamplerChain(s)
        return [chain.pick(x, hist, record_stages=record).token_id for x in seq]

    assert run() == run()


@FAST
@given(rows(), sampler_settings(), st.integers(0, 40))
def test_model_statistics_match_a_float64_reference(x, s, top_n):
    pick = SamplerChain(s).pick(x, history_for(x), top_n=top_n)
    lp, ent = reference(x)
    t = pick.token_id
    assert np.isfinite(lp[t]), "a token the model masked (-inf) is never chosen"
    assert math.isclose(pick.logprob, lp[t], abs_tol=1e-4)
    assert pick.rank == int(np.count_nonzero(x.astype(np.float64) > x[t]))
    assert math.isclose(pick.entropy, ent, rel_tol=1e-4, abs_tol=1e-5)
    # top-N: most likely first, ties by lower id, only finite tokens.
    fin = np.flatnonzero(np.isfinite(x))
    expected = fin[np.lexsort((fin, -x[fin].astype(np.float64)))][:top_n]
    assert [p.token_id for p in pick.top_model] == expected.tolist()
    np.testing.assert_allclose([p.logprob for p in pick.top_model], lp[expected], atol=1e-4)


@FAST
@given(rows(), sampler_settings(), st.data())
def test_force_token_is_honoured(x, s, data):
    token = data.draw(st.integers(0, x.size - 1))
    pick = SamplerChain(s).pick(x, history_for(x), force_token=token, record_stages=data.draw(st.booleans()))
    assert pick.token_id == token and pick.forced
    lp, _ = reference(x)
    if np.isfinite(lp[token]):
        assert math.isclose(pick.logprob, lp[token], abs_tol=1e-4)
    else:
        assert pick.logprob == -math.inf
    if s.greedy:
        best = SamplerChain(s).pick(x, history_for(x)).token_id
        assert pick.sampler_logprob == (0.0 if token == best else -math.inf)
    else:
        # The chain's output does not depend on what is drawn, so an unforced
        # pick from a twin chain (same seed: same XTC draw) reports the same
        # sampler distribution.
        twin = {p.token_id: p.logprob for p in SamplerChain(s).pick(x, history_for(x), top_n=x.size).top_sampler}
        expected = twin.get(token, -math.inf)
        assert pick.sampler_logprob == expected or math.isclose(pick.sampler_logprob, expected, abs_tol=1e-6)


@FAST
@given(rows(), sampler_settings(), st.integers(0, 10))
def test_stage_statistics_are_consistent(x, s, top_n):
    chain = SamplerChain(s)
    pick = chain.pick(x, history_for(x), top_n=top_n, record_stages=True)
    assert tuple(st_.name for st_ in pick.stages) == chain.stage_names
    previous = int(np.count_nonzero(np.isfinite(x)))
    for stage in pick.stages:
        assert 1 <= stage.survivors <= previous, "no stage brings a token back or removes all"
        assert 0.0 <= stage.mass_kept <= 1.0
        if stage.survivors == previous:
            assert stage.mass_kept == 1.0
        if stage.name in ("penalties", "temperature"):
            assert stage.survivors == previous
        assert stage.entropy >= 0.0
        assert len(stage.top) == min(top_n, stage.survivors)
        lps = [p.logprob for p in stage.top]
        assert lps == sorted(lps, reverse=True) and all(lp <= 1e-6 for lp in lps)
        previous = stage.survivors
    if pick.stages and not s.greedy:
        assert pick.stages[-1].top == pick.top_sampler
