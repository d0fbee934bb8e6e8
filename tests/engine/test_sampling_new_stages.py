"""The new stages where llama.cpp has no oracle (smoothing), and how the chain holds them: vocabulary, state, bans."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling.chain import BANNED_STAGE
from engine.sampling.shaping import make_smoothing
from engine.sampling.stages import StageContext

EMPTY = np.zeros(0, dtype=np.int64)


def ctx() -> StageContext:
    return StageContext(EMPTY, np.random.default_rng(0))


def row(v: int = 500, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(v) * scale).astype(np.float32)


# ------------------------------------------------------------------ smoothing


def test_smoothing_keeps_the_top_logit_and_the_order_and_pulls_the_tail_down_with_the_square():
    x = row()
    x[::7] = -np.inf
    out = make_smoothing(0.5, 1.0)(x, ctx())
    fin = np.isfinite(x)
    assert np.array_equal(np.isfinite(out), fin)
    assert out.max() == x.max() and np.argmax(out) == np.argmax(x)
    order = np.argsort(-x[fin], kind="stable")
    assert np.all(np.diff(out[fin][order]) <= 0)  # curve 1 (<= 3): monotone
    # the drop below the top grows with the square of the distance: a token 2x as far drops 4x as much
    d = x.max() - x[fin]
    drop = x.max() - out[fin]
    far = d > 1
    np.testing.assert_allclose(drop[far] / d[far] ** 2, 0.5 * 1.0, rtol=1e-4)


def test_smoothing_flattens_near_the_top_and_sharpens_the_tail():
    x = np.array([10.0, 9.8, 9.5, 4.0, 0.0], dtype=np.float32)
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    out = make_smoothing(0.3, 1.0)(x, ctx())
    q = np.exp(out - out.max()) / np.exp(out - out.max()).sum()
    assert q[1] / q[0] > p[1] / p[0]  # near candidates closer together
    assert q[3] < p[3] and q[4] < p[4]  # the tail cut harder


def test_a_higher_smoothing_curve_punishes_the_tail_more():
    x = row(seed=3)
    tail = x < x.max() - 3
    plain = make_smoothing(0.3, 1.0)(x, ctx())
    steep = make_smoothing(0.3, 3.0)(x, ctx())
    assert np.all(steep[tail] < plain[tail])


# ------------------------------------------------------------ the chain holds them


def test_settings_that_need_the_tokenizer_say_so_without_one():
    with pytest.raises(ValueError, match="the logit bias for the text 'hello' needs the model's tokenizer"):
        SamplerChain(SamplerSettings(logit_bias={"hello": 1.0}))
    with pytest.raises(ValueError, match="DRY's sequence breakers needs the model's tokenizer"):
        SamplerChain(SamplerSettings(dry_multiplier=0.8))
    SamplerChain(SamplerSettings(dry_multiplier=0.8, dry_sequence_breakers=()))  # no breakers: no tokenizer needed


def test_a_logit_bias_outside_the_vocabulary_is_named():
    chain = SamplerChain(SamplerSettings(logit_bias={900: 1.0}, seed=0))
    with pytest.raises(ValueError, match="logit_bias names token 900, but this model's vocabulary has 500 tokens"):
        chain.pick(row(), EMPTY)


def test_mirostat_state_is_the_chains_and_restore_replays_a_step():
    s = SamplerSettings(mirostat=2, mirostat_tau=3.0, seed=5)
    chain = SamplerChain(s)
    assert chain.state() == (6.0,)
    rows = [row(seed=i) for i in range(6)]
    for x in rows[:3]:
        chain.pick(x, EMPTY, top_n=0)
    saved = chain.state()
    assert saved != (6.0,)
    # forced to the top token (mirostat always keeps it), whose probability depends on how much mu lets through
    rest = [chain.pick(x, EMPTY, top_n=0, force_token=int(np.argmax(x))).sampler_logprob for x in rows[3:]]
    chain.restore(saved)
    again = [chain.pick(x, EMPTY, top_n=0, force_token=int(np.argmax(x))).sampler_logprob for x in rows[3:]]
    assert rest == again and len(set(rest)) > 1 and all(lp < 0 for lp in rest)
    assert SamplerChain(s).state() == (6.0,)  # a new chain (a new run) starts afresh: the settings hold no state


def test_banned_tokens_are_removed_before_every_stage_and_recorded():
    x = row()
    top = int(np.argmax(x))
    chain = SamplerChain(SamplerSettings(temperature=0.0, top_k=5, seed=0))
    pick = chain.pick(x, EMPTY, top_n=5, record_stages=True, banned={top})
    assert pick.token_id != top and pick.token_id == int(np.argsort(-x)[1])
    assert pick.stages[0].name == BANNED_STAGE and pick.stages[0].survivors == x.size - 1
    top_prob = math.exp(float(x[top]) - float(np.logaddexp.reduce(x.astype(np.float64))))
    assert math.isclose(pick.stages[0].mass_kept, 1 - top_prob, rel_tol=1e-5)
    assert top not in [p.token_id for p in pick.stages[1].top]
