"""SamplerChain: building from settings, choosing, reporting; SamplerSettings validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from engine.sampling import DEFAULT_ORDER, STAGE_NAMES, Pick, SamplerChain, SamplerSettings, StageStats
from engine.events import TokenProb

EMPTY = np.zeros(0, dtype=np.int64)


def logits(v: int = 500, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(v) * scale).astype(np.float32)
    x[rng.choice(v, size=min(3, v), replace=False)] += 6.0
    return x


def survivors_distribution(chain: SamplerChain, x: np.ndarray, history=EMPTY) -> dict[int, float]:
    """The final sampler distribution, read back through top_sampler with top_n = V."""
    pick = chain.pick(x, history, top_n=x.size)
    return {p.token_id: p.logprob for p in pick.top_sampler}


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.5}, "temperature must be >= 0 (0 = greedy), got -0.5"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"top_k": -1}, "top_k must be >= 0 (0 = off), got -1"),
        ({"top_k": 2.5}, "top_k must be an integer, got 2.5"),
        ({"min_p": 1.1}, "min_p must be in [0, 1]"),
        ({"typical_p": 0.0}, "typical_p must be in (0, 1]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be between 0.01 and 100 (1 = off)"),
        ({"penalty_last_n": -2}, "penalty_last_n must be >= -1"),
        ({"xtc_threshold": 0.7}, "xtc_threshold must be in (0, 0.5]"),
        ({"seed": -1}, "seed must be in [0, 2**63)"),
        ({"order": ("top_k", "banana")}, "unknown sampler stages ['banana']; known: grammar, logit_bias, penalties, dry"),
        ({"order": ("top_k", "top_k")}, "names a stage twice"),
    ],
)
def test_settings_validation_messages(kwargs, message):
    with pytest.raises(ValueError) as err:
        SamplerSettings(**kwargs)
    assert str(err.value).startswith("invalid sampler settings: ")
    assert message in str(err.value)


def test_settings_report_every_problem_at_once():
    with pytest.raises(ValueError) as err:
        SamplerSettings(temperature=-1, top_p=2, top_k=-3)
    assert str(err.value).count(";") == 2


def test_settings_round_trip_and_unknown_keys():
    s = SamplerSettings(temperature=0.7, top_p=0.9, order=["temperature", "top_p"], seed=3)
    assert s.order == ("temperature", "top_p")
    assert SamplerSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown sampler settings: top_z"):
        SamplerSettings.from_dict({"top_z": 3})
    with pytest.raises(ValueError, match="top_p must be"):
        s.with_(top_p=0)


def test_default_order_is_llamacpps_with_grammar_and_bias_first_and_the_adaptive_stages_last():
    # llama.cpp's common_params_sampling.samplers, with the stages it runs outside that list placed where it runs them
    assert DEFAULT_ORDER == (
        "grammar", "logit_bias", "penalties", "dry", "top_n_sigma", "smoothing", "top_k", "typical_p", "top_p", "min_p", "xtc",
        "temperature", "mirostat", "adaptive_p",
    )
    assert set(DEFAULT_ORDER) == set(STAGE_NAMES)
    assert SamplerSettings().order == DEFAULT_ORDER


def test_a_saved_order_from_before_the_new_stages_reads_as_todays_default():
    old = ["penalties", "top_k", "top_p", "min_p", "typical_p", "xtc", "temperature"]
    assert SamplerSettings.from_dict({"order": old}).order == DEFAULT_ORDER
    custom = ["temperature", "top_k"]
    assert SamplerSettings.from_dict({"order": custom}).order == tuple(custom)


# ------------------------------------------------------------------ building


def test_neutral_and_missing_stages_are_not_run():
    assert SamplerChain(SamplerSettings()).stage_names == ()
    assert SamplerChain(SamplerSettings(temperature=0)).stage_names == ()
    s = SamplerSettings(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1)
    assert SamplerChain(s).stage_names == ("penalties", "top_k", "top_p", "min_p", "temperature")
    assert SamplerChain(s.with_(order=("temperature", "min_p"))).stage_names == ("temperature", "min_p")
    assert SamplerChain(s.with_(penalty_last_n=0)).stage_names == ("top_k", "top_p", "min_p", "temperature")
    assert SamplerChain(SamplerSettings(xtc_probability=0.5, typical_p=0.9)).stage_names == ("typical_p", "xtc")


def test_seed_is_exposed_and_replays():
    chain = SamplerChain(SamplerSettings(temperature=1.5))
    assert isinstance(chain.seed, int) and 0 <= chain.seed < 2**63
    replay = SamplerChain(SamplerSettings(temperature=1.5, seed=chain.seed))
    rows = [logits(300, seed=i, scale=1.0) for i in range(30)]
    assert [chain.pick(x, EMPTY).token_id for x in rows] == [replay.pick(x, EMPTY).token_id for x in rows]
    assert SamplerChain(SamplerSettings(seed=5)).seed == 5


# ------------------------------------------------------------------ choosing


def test_greedy_takes_the_argmax_of_the_chain_output():
    x = logits()
    pick = SamplerChain(SamplerSettings(temperature=0, top_p=0.5)).pick(x, EMPTY, top_n=5)
    assert pick.token_id == int(np.argmax(x))
    assert pick.rank == 0 and pick.sampler_logprob == 0.0
    assert [(p.token_id, p.logprob) for p in pick.top_sampler] == [(pick.token_id, 0.0)]
    # Penalties can move the argmax: greedy follows the chain, not the raw logits.
    best = int(np.argmax(x))
    pen = SamplerChain(SamplerSettings(temperature=0, presence_penalty=2.0, frequency_penalty=2.0))
    hist = np.full(10, best)
    assert pen.pick(x, hist).token_id == int(np.argmax(np.where(np.arange(x.size) == best, x - 22.0, x)))


def test_greedy_forced_to_another_token_reports_it():
    x = logits()
    other = int(np.argsort(x)[-2])
    pick = SamplerChain(SamplerSettings(temperature=0)).pick(x, EMPTY, force_token=other)
    assert pick.token_id == other and pick.forced
    assert pick.rank == 1 and pick.sampler_logprob == -math.inf


def test_force_token_is_honoured_and_reported():
    x = logits()
    chain = SamplerChain(SamplerSettings(temperature=0.8, top_k=10, seed=1))
    inside = int(np.argsort(x)[-3])
    outside = int(np.argmin(x))
    p = chain.pick(x, EMPTY, force_token=inside)
    assert p.token_id == inside and p.forced and p.rank == 2 and math.isfinite(p.sampler_logprob)
    q = chain.pick(x, EMPTY, force_token=outside)
    assert q.token_id == outside and q.rank == x.size - 1 and q.sampler_logprob == -math.inf
    assert not chain.pick(x, EMPTY).forced


def test_forcing_keeps_the_random_stream_aligned():
    rows = [logits(200, seed=i, scale=1.0) for i in range(20)]
    s = SamplerSettings(temperature=1.0, top_p=0.95, seed=42)
    free = SamplerChain(s)
    branched = SamplerChain(s)
    a = [free.pick(x, EMPTY).token_id for x in rows]
    b = [branched.pick(x, EMPTY, force_token=7 if i == 5 else None).token_id for i, x in enumerate(rows)]
    assert b[5] == 7
    assert a[:5] == b[:5] and a[6:] == b[6:]


def test_draws_follow_the_sampler_distribution():
    x = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03], dtype=np.float32))
    chain = SamplerChain(SamplerSettings(top_p=0.8, seed=0))  # keeps 0.5, 0.25, 0.15
    counts = np.bincount([chain.pick(x, EMPTY, top_n=0).token_id for _ in range(6000)], minlength=5)
    expected = np.array([0.5, 0.25, 0.15, 0, 0]) / 0.9 * 6000
    assert counts[3] == counts[4] == 0
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected + 1))


def test_same_seed_same_token_for_any_float_dtype_of_the_same_values():
    x16 = logits(1000).astype(np.float16)
    s = SamplerSettings(temperature=0.9, top_p=0.9, seed=11)
    a = [SamplerChain(s).pick(x16, EMPTY).token_id for _ in range(3)]
    b = [SamplerChain(s).pick(x16.astype(np.float32), EMPTY).token_id for _ in range(3)]
    c = [SamplerChain(s).pick(torch.from_numpy(x16.astype(np.float32)), EMPTY).token_id for _ in range(3)]
    assert a == b == c


# ------------------------------------------------------------------ reporting


def test_pick_reports_the_model_view():
    x = logits(400, seed=3)
    pick = SamplerChain(SamplerSettings(temperature=0.7, top_k=20, seed=0)).pick(x, EMPTY, top_n=5)
    x64 = x.astype(np.float64)
    lse = x64.max() + np.log(np.exp(x64 - x64.max()).sum())
    assert pick.logprob == pytest.approx(x64[pick.token_id] - lse, abs=1e-5)
    assert pick.rank == int(np.sum(x64 > x64[pick.token_id]))
    p = np.exp(x64 - lse)
    assert pick.entropy == pytest.approx(-(p * np.log(p)).sum(), rel=1e-5)
    top = np.argsort(-x64, kind="stable")[:5]
    assert [p.token_id for p in pick.top_model] == top.tolist()
    np.testing.assert_allclose([p.logprob for p in pick.top_model], x64[top] - lse, atol=1e-5)


def test_top_n_zero_gives_empty_tops_and_small_python_values():
    chain = SamplerChain(SamplerSettings(temperature=0.5, min_p=0.1, seed=0))
    pick = chain.pick(logits(), EMPTY, top_n=0, record_stages=True)
    assert pick.top_model == () and pick.top_sampler == ()
    assert all(s.top == () for s in pick.stages)
    pick = chain.pick(logits(), EMPTY, top_n=3, record_stages=True)
    for value in (pick.token_id, pick.rank):
        assert type(value) is int
    for value in (pick.logprob, pick.sampler_logprob, pick.entropy):
        assert type(value) is float
    for pairs in [pick.top_model, pick.top_sampler] + [s.top for s in pick.stages]:
        assert len(pairs) == 3
        assert all(isinstance(p, TokenProb) and type(p.token_id) is int and type(p.logprob) is float for p in pairs)
    for s in pick.stages:
        assert isinstance(s, StageStats) and type(s.survivors) is int and type(s.mass_kept) is float


def test_recorded_stages_follow_the_chain():
    x = logits(800)
    s = SamplerSettings(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02, repetition_penalty=1.2, seed=0)
    chain = SamplerChain(s)
    pick = chain.pick(x, np.arange(0, 800, 3), top_n=4, record_stages=True)
    assert isinstance(pick, Pick)
    assert tuple(st.name for st in pick.stages) == chain.stage_names
    pen, top_k, top_p, min_p, temp = pick.stages
    assert pen.survivors == 800 and pen.mass_kept == 1.0
    assert top_k.survivors == 50 and 0 < top_k.mass_kept < 1
    # mass_kept is measured under the distribution entering the stage (here: penalized
    # over the last penalty_last_n = 64 history tokens).
    penalized = torch.from_numpy(x.copy())[None]
    window = torch.as_tensor(np.arange(0, 800, 3)[-64:])[None]
    penalized = RepetitionPenaltyLogitsProcessor(1.2)(window, penalized)
    p = torch.softmax(penalized.double(), -1).numpy()[0]
    assert top_k.mass_kept == pytest.approx(np.sort(p)[-50:].sum(), abs=1e-6)
    assert pen.entropy == pytest.approx(-(p * np.log(p)).sum(), rel=1e-5)
    assert top_p.survivors <= 50 and min_p.survivors <= top_p.survivors
    assert temp.survivors == min_p.survivors and temp.mass_kept == 1.0
    assert temp.top == pick.top_sampler
    assert chain.pick(x, EMPTY).stages is None


def test_recording_does_not_change_the_pick():
    rows = [logits(300, seed=i, scale=1.5) for i in range(10)]
    s = SamplerSettings(temperature=1.2, top_p=0.9, xtc_probability=0.5, xtc_threshold=0.05, seed=9)
    a, b = SamplerChain(s), SamplerChain(s)
    assert [a.pick(x, EMPTY).token_id for x in rows] == [
        b.pick(x, EMPTY, record_stages=True).token_id for x in rows
    ]
    g = SamplerSettings(temperature=0, top_p=0.5, xtc_probability=1.0, xtc_threshold=0.01, seed=9)
    a, b = SamplerChain(g), SamplerChain(g)
    assert [a.pick(x, EMPTY).token_id for x in rows] == [
        b.pick(x, EMPTY, record_stages=True).token_id for x in rows
    ]


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((2, 5), np.float32), "one non-empty row"),
        (np.zeros(0, np.float32), "one non-empty row"),
        (np.array([0.0, np.nan], np.float32), "finite"),
        (np.array([0.0, np.inf], np.float32), "finite"),
        (np.full(4, -np.inf, np.float32), "finite"),
    ],
)
def test_malformed_logits_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        SamplerChain(SamplerSettings()).pick(bad, EMPTY)


def test_force_token_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SamplerChain(SamplerSettings()).pick(logits(10), EMPTY, force_token=10)


def test_masked_tokens_in_the_raw_logits_are_handled():
    x = logits(100)
    x[::2] = -np.inf  # e.g. a padded vocabulary
    pick = SamplerChain(SamplerSettings(temperature=1.0, seed=0)).pick(x, EMPTY, top_n=100, record_stages=True)
    assert pick.token_id % 2 == 1
    assert len(pick.top_model) == 50 and all(p.token_id % 2 == 1 for p in pick.top_model)
    assert math.fsum(p.prob for p in pick.top_model) == pytest.approx(1.0, abs=1e-6)


# ------------------------------------------- the whole chain vs transformers


_HF_STAGES = ("penalties", "top_k", "top_p", "min_p", "typical_p", "temperature")


def _hf_chain(order, s: SamplerSettings, x: np.ndarray, history: np.ndarray) -> np.ndarray:
    procs = {
        "penalties": RepetitionPenaltyLogitsProcessor(s.repetition_penalty),
        "top_k": TopKLogitsWarper(s.top_k),
        "top_p": TopPLogitsWarper(s.top_p),
        "min_p": MinPLogitsWarper(s.min_p),
        "typical_p": TypicalLogitsWarper(s.typical_p),
        "temperature": TemperatureLogitsWarper(s.temperature),
    }
    ids = torch.as_tensor(history).long()[None]
    out = LogitsProcessorList([procs[n] for n in order])(ids, torch.from_numpy(x.copy())[None])
    return torch.log_softmax(out, -1).numpy()[0]


@pytest.mark.parametrize(
    "order",
    [
        DEFAULT_ORDER,
        ("temperature", "penalties", "top_k", "top_p", "min_p", "typical_p"),  # transformers' own order
        ("min_p", "temperature", "typical_p", "top_p", "top_k", "penalties"),
    ],
)
def test_final_distribution_matches_transformers_in_the_same_order(order):
    s = SamplerSettings(
        temperature=0.7, top_k=60, top_p=0.95, min_p=0.01, typical_p=0.97,
        repetition_penalty=1.3, penalty_last_n=-1, order=tuple(n for n in order if n in _HF_STAGES), seed=0,
    )
    for seed in range(4):
        x = logits(700, seed=seed, scale=2.0)
        hist = np.random.default_rng(seed).integers(0, 700, size=40)
        ours = survivors_distribution(SamplerChain(s), x, hist)
        theirs = _hf_chain(s.order, s, x, hist)
        assert sorted(ours) == np.flatnonzero(np.isfinite(theirs)).tolist()
        np.testing.assert_allclose([ours[i] for i in sorted(ours)], theirs[sorted(ours)], atol=1e-5)


# ------------------------------------------------------- chunked arithmetic


def test_draw_is_an_inverse_cdf_over_token_ids():
    from engine.sampling.distribution import Dist as _Dist

    x = logits(1000, scale=1.0)
    x[::3] = -np.inf
    dist = _Dist(x)
    fin = np.flatnonzero(np.isfinite(x))
    w = np.exp(x[fin] - x.max()).astype(np.float64)  # float32 weights, summed in float64
    cum = np.cumsum(w)
    for u in np.linspace(0, 1, 2001, endpoint=False):
        j = int(np.searchsorted(cum, u * cum[-1], side="right"))
        if abs(cum[j] - u * cum[-1]) > 1e-9 and (j == 0 or abs(cum[j - 1] - u * cum[-1]) > 1e-9):
            assert dist.draw(float(u)) == fin[j]
    assert dist.draw(np.nextafter(1.0, 0.0)) == fin[-1]


def test_chunking_does_not_change_results(monkeypatch):
    from engine.sampling import distribution as chain_mod
    from engine.sampling import stages as stages_mod

    rows = [logits(300, seed=i, scale=1.0) for i in range(30)]
    s = SamplerSettings(temperature=1.3, typical_p=0.99, xtc_probability=0.5, xtc_threshold=0.05, seed=4)

    def run():
        chain = SamplerChain(s)
        return [chain.pick(x, EMPTY, top_n=5, record_stages=True) for x in rows]

    whole = run()
    monkeypatch.setattr(chain_mod, "CHUNK", 7)
    monkeypatch.setattr(stages_mod, "CHUNK", 7)
    chunked = run()
    assert [p.token_id for p in whole] == [p.token_id for p in chunked]
    for a, b in zip(whole, chunked):
        assert a.entropy == pytest.approx(b.entropy, rel=1e-6)
        assert a.sampler_logprob == pytest.approx(b.sampler_logprob, abs=1e-6)
        for sa, sb in zip(a.stages, b.stages):
            assert sa.survivors == sb.survivors
            assert sa.mass_kept == pytest.approx(sb.mass_kept, abs=1e-6)
