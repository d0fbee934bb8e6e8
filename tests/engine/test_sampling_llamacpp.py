"""Every sampler stage against llama.cpp's own sampler (llama-cpp-python's low-level API) as the oracle.

Each test builds the llama.cpp sampler with the same settings, feeds it the
same history (`llama_sampler_accept`) and the same float32 logits
(`llama_sampler_apply` on a `llama_token_data_array`), and checks that our
stage keeps the same tokens and gives the same distribution to 1e-6: one
stage at a time, and all of them chained in llama.cpp's default order, on
rows at several scales over the default model's 49,152-token vocabulary.
"""

from __future__ import annotations

import ctypes

import llama_cpp as L
import numpy as np
import pytest

from engine.backends.llamacpp.tokenizer import LlamaCppTokenizer
from engine.sampling import SamplerChain, SamplerSettings
from engine.sampling.adaptive import AdaptiveP, Mirostat, Mirostat2
from engine.sampling.dry import breaker_sequences, make_dry
from engine.sampling.settings import DEFAULT_DRY_BREAKERS
from engine.sampling.shaping import make_logit_bias, make_temperature_ext, make_top_n_sigma
from engine.sampling.stages import (
    StageContext,
    make_min_p,
    make_penalties,
    make_temperature,
    make_top_k,
    make_top_p,
    make_typical_p,
    make_xtc,
)
from engine.sources.default_model import default_model_path
from tests.engine.llamacpp_sampler_oracle import Sampler, Vocab, apply, chain, compare, mass_boundary

SEED = 1234


@pytest.fixture(scope="module")
def vocab():
    v = Vocab(str(default_model_path()))
    yield v
    v.close()


@pytest.fixture(scope="module")
def tokenizer(vocab):
    return LlamaCppTokenizer(vocab.model)


def rows(v: int, seed: int = 0) -> list[np.ndarray]:
    """Rows at several scales: near-flat, spread, a language model's peaked shape, and very peaked."""
    rng = np.random.default_rng(seed)
    out = []
    for scale, strong in ((0.5, 0), (2.0, 0), (3.0, 8), (8.0, 3)):
        x = (rng.standard_normal(v) * scale).astype(np.float32)
        if strong:
            x[rng.choice(v, size=strong, replace=False)] = x.max() + rng.uniform(2, 10, size=strong).astype(np.float32)
        out.append(x)
    return out


def ctx(history=()) -> StageContext:
    return StageContext(np.asarray(history, dtype=np.int64), np.random.default_rng(0))


def history_with_repeats(v: int, newline: int, seed: int = 0) -> np.ndarray:
    """A history whose tail repeats earlier stretches (what DRY and the penalties look for), with a newline inside one."""
    rng = np.random.default_rng(seed)
    seg = rng.integers(0, v, 12)
    seg[5] = newline
    parts = [rng.integers(0, v, 40), seg, rng.integers(0, v, 9), seg[6:], rng.integers(0, v, 5), seg[:4], seg[7:10]]
    return np.concatenate(parts).astype(np.int64)


# ---------------------------------------------------------------- one stage at a time


@pytest.mark.model
@pytest.mark.parametrize("k", [1, 5, 40, 1000])
def test_top_k(vocab, k):
    for x in rows(vocab.n):
        compare(make_top_k(k)(x, ctx()), apply(Sampler(L.llama_sampler_init_top_k(k)), x))


@pytest.mark.model
@pytest.mark.parametrize("p", [0.5, 0.9, 0.95])
def test_top_p(vocab, p):
    for x in rows(vocab.n):
        theirs = apply(Sampler(L.llama_sampler_init_top_p(p, 0)), x)
        compare(make_top_p(p)(x, ctx()), theirs, may_differ=mass_boundary(x, p, typical=False))


@pytest.mark.model
@pytest.mark.parametrize("p", [0.02, 0.05, 0.3])
def test_min_p(vocab, p):
    for x in rows(vocab.n):
        compare(make_min_p(p)(x, ctx()), apply(Sampler(L.llama_sampler_init_min_p(p, 0)), x))


@pytest.mark.model
@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_typical_p(vocab, p):
    for x in rows(vocab.n):
        theirs = apply(Sampler(L.llama_sampler_init_typical(p, 0)), x)
        compare(make_typical_p(p)(x, ctx()), theirs, may_differ=mass_boundary(x, p, typical=True))


@pytest.mark.model
@pytest.mark.parametrize("t", [0.3, 0.8, 1.7])
def test_temperature(vocab, t):
    for x in rows(vocab.n):
        compare(make_temperature(t)(x, ctx()), apply(Sampler(L.llama_sampler_init_temp(t)), x))


@pytest.mark.model
@pytest.mark.parametrize("t, delta, exponent", [(0.8, 0.5, 1.0), (1.0, 0.9, 2.0), (0.4, 0.6, 0.5), (1.2, 0.0, 1.0)])
def test_dynamic_temperature_is_temp_ext(vocab, t, delta, exponent):
    for x in rows(vocab.n):
        for pre in (None, 50):  # on the whole vocabulary, and after a top-k (the entropy of fewer survivors)
            if pre:
                x = make_top_k(pre)(x, ctx())
            kept = np.flatnonzero(x > -np.inf)
            theirs = apply(Sampler(L.llama_sampler_init_temp_ext(t, delta, exponent)), x[kept])
            theirs = (kept[theirs[0]], theirs[1], -1)
            compare(make_temperature_ext(t, delta, exponent)(x, ctx()), theirs)


@pytest.mark.model
@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.3])
def test_xtc_when_it_fires(vocab, threshold):
    for x in rows(vocab.n):  # probability 1: fires on every call in both, so the draws do not matter
        theirs = apply(Sampler(L.llama_sampler_init_xtc(1.0, threshold, 0, SEED)), x)
        compare(make_xtc(1.0, threshold)(x, ctx()), theirs)


@pytest.mark.model
@pytest.mark.parametrize("n", [0.5, 1.0, 2.0, 3.5])
def test_top_n_sigma(vocab, n):
    for x in rows(vocab.n):
        compare(make_top_n_sigma(n)(x, ctx()), apply(Sampler(L.llama_sampler_init_top_n_sigma(n)), x))


@pytest.mark.model
@pytest.mark.parametrize("last_n, rep, freq, pres", [(64, 1.3, 0.0, 0.0), (16, 1.1, 0.5, 0.3), (256, 0.8, -0.2, 1.0)])
def test_penalties(vocab, last_n, rep, freq, pres):
    hist = history_with_repeats(vocab.n, newline=198)
    for x in rows(vocab.n):
        theirs = apply(Sampler(L.llama_sampler_init_penalties(vocab.n, last_n, rep, freq, pres)).accept(hist), x)
        compare(make_penalties(rep, pres, freq, last_n)(x, ctx(hist)), theirs)


def _llama_dry(vocab, mult, base, allowed, last_n, breakers) -> Sampler:
    arr = (ctypes.c_char_p * len(breakers))(*[b.encode() for b in breakers])
    return Sampler(L.llama_sampler_init_dry(vocab.vocab, mult, base, allowed, last_n, arr, len(breakers)))


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize(
    "mult, base, allowed, last_n, breakers",
    [
        (0.8, 1.75, 2, 256, DEFAULT_DRY_BREAKERS),
        (0.8, 1.75, 2, 256, ()),  # no breakers: repeats reach across the newline
        (2.0, 1.1, 3, 30, DEFAULT_DRY_BREAKERS),
        (0.5, 3.0, 1, 100, ("\n", "the end")),  # a multi-token breaker
    ],
)
def test_dry(vocab, tokenizer, mult, base, allowed, last_n, breakers):
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    for seed in range(3):
        hist = history_with_repeats(vocab.n, newline, seed=seed)
        ours_stage = make_dry(mult, base, allowed, last_n, breaker_sequences(tokenizer, breakers, vocab.n))
        for x in rows(vocab.n, seed=seed):
            theirs = apply(_llama_dry(vocab, mult, base, allowed, last_n, breakers).accept(hist), x)
            out = ours_stage(x, ctx(hist))
            compare(out, theirs)
            assert not np.array_equal(out, x) or not breakers  # the history does repeat: something was penalized


@pytest.mark.model
def test_dry_breaker_tokens_match_llamacpps_scan(vocab, tokenizer):
    """Our breaker map decides which repeats are cut: a history that is one long repeat, a breaker in the middle."""
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    colon_tokens = [i for i in range(vocab.n) if b":" in tokenizer.token_bytes(i)]
    rng = np.random.default_rng(3)
    seg = rng.integers(0, vocab.n, 20)
    for breaker_tok in (newline, colon_tokens[len(colon_tokens) // 2]):
        seg2 = seg.copy()
        seg2[10] = breaker_tok
        hist = np.concatenate([seg2, seg2[:15]])
        for x in rows(vocab.n)[:2]:
            theirs = apply(_llama_dry(vocab, 1.0, 1.75, 2, 200, DEFAULT_DRY_BREAKERS).accept(hist), x)
            stage = make_dry(1.0, 1.75, 2, 200, breaker_sequences(tokenizer, DEFAULT_DRY_BREAKERS, vocab.n))
            compare(stage(x, ctx(hist)), theirs)


@pytest.mark.model
@pytest.mark.parametrize("base", [1.0, 3.0, 1.75])
def test_dry_on_a_history_stuck_in_a_loop(vocab, tokenizer, base):
    """Repeats far longer than where the penalty stops growing (our search stops there; llama.cpp's does not)."""
    rng = np.random.default_rng(5)
    hist = np.resize(rng.integers(0, vocab.n, 30), 700).astype(np.int64)
    stage = make_dry(0.8, base, 2, 600, breaker_sequences(tokenizer, DEFAULT_DRY_BREAKERS, vocab.n))
    for x in rows(vocab.n)[:2]:
        theirs = apply(_llama_dry(vocab, 0.8, base, 2, 600, DEFAULT_DRY_BREAKERS).accept(hist), x)
        compare(stage(x, ctx(hist)), theirs)


def _llama_bias(vocab, pairs) -> Sampler:
    arr = (L.llama_logit_bias * len(pairs))(*[L.llama_logit_bias(token=t, bias=b) for t, b in pairs])
    return Sampler(L.llama_sampler_init_logit_bias(vocab.n, len(pairs), arr))


@pytest.mark.model
def test_logit_bias_by_id_and_by_text(vocab, tokenizer):
    # llama.cpp server: a text key biases every token of its tokenization (repeated tokens twice).
    bias = {15: 5.0, "hello": -3.0, "aaaa aaaa": 1.5, 400: False, "77": 2.0}
    pairs = [(15, 5.0)] + [(t, -3.0) for t in vocab.tokenize("hello")] + [(t, 1.5) for t in vocab.tokenize("aaaa aaaa")]
    pairs += [(400, -np.inf), (77, 2.0)]
    chain_ = SamplerChain(SamplerSettings(logit_bias=bias, order=("logit_bias",), seed=0), vocab=tokenizer)
    for x in rows(vocab.n):
        theirs = apply(_llama_bias(vocab, pairs), x)
        ours = survivors(chain_, x)
        compare(ours, theirs)
        assert 400 not in set(np.flatnonzero(ours > -np.inf))


@pytest.mark.model
def test_logit_bias_stage_adds_repeated_ids_like_llamacpp(vocab):
    pairs = [(7, 1.0), (7, 2.5), (9, -1.0)]
    for x in rows(vocab.n):
        ours = make_logit_bias([t for t, _ in pairs], [b for _, b in pairs])(x, ctx())
        compare(ours, apply(_llama_bias(vocab, pairs), x))


# ----------------------------------------------------- stages with state: several steps


@pytest.mark.model
@pytest.mark.parametrize("version, tau, eta", [(1, 5.0, 0.1), (1, 3.0, 0.3), (2, 5.0, 0.1), (2, 2.0, 0.5)])
def test_mirostat_follows_llamacpp_step_by_step(vocab, version, tau, eta):
    """llama.cpp's mirostat draws with its own generator; we take the token it drew, and after every step the
    truncation (which depends on mu, which depends on every earlier pick) must still agree."""
    if version == 1:
        theirs_s = Sampler(L.llama_sampler_init_mirostat(vocab.n, SEED, tau, eta, 100))
        ours = Mirostat(tau, eta)
    else:
        theirs_s = Sampler(L.llama_sampler_init_mirostat_v2(SEED, tau, eta))
        ours = Mirostat2(tau, eta)
    steps = rows(vocab.n, seed=1) + rows(vocab.n, seed=2) + rows(vocab.n, seed=3)
    for x in steps:
        theirs = apply(theirs_s, x)
        compare(ours(x, ctx()), theirs)
        ours.accept(theirs[2])


@pytest.mark.model
@pytest.mark.parametrize("target, decay", [(0.3, 0.9), (0.1, 0.5), (0.7, 0.0)])
def test_adaptive_p_follows_llamacpp_step_by_step(vocab, target, decay):
    theirs_s = Sampler(L.llama_sampler_init_adaptive_p(target, decay, SEED))
    ours = AdaptiveP(target, decay)
    steps = rows(vocab.n, seed=4) + rows(vocab.n, seed=5)
    for i, x in enumerate(steps):
        if i % 2:  # also after a filter, as llama.cpp recommends (min-p before adaptive-p)
            x = make_min_p(0.05)(x, ctx())
        kept = np.flatnonzero(x > -np.inf)  # llama.cpp gets the survivors only, numbered 0..n-1 in its array
        local_ids, logits, local_pick = apply(theirs_s, x[kept])
        compare(ours(x, ctx()), (kept[local_ids], logits, -1))
        theirs_s.accept([local_pick])
        ours.accept(int(kept[local_pick]))


# ---------------------------------------------------------- the whole chain, llama.cpp's order


def survivors(chain_: SamplerChain, x: np.ndarray, history=()) -> np.ndarray:
    """The chain's final distribution as a score row (-inf = removed), read back through top_sampler."""
    pick = chain_.pick(x, np.asarray(history, dtype=np.int64), top_n=x.size)
    out = np.full(x.size, -np.inf, dtype=np.float32)
    for p in pick.top_sampler:
        out[p.token_id] = p.logprob
    return out


@pytest.mark.model
@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # llama.cpp's defaults
        dict(temperature=1.1, dynatemp_range=0.5, top_k=0, top_p=0.98, min_p=0.02, top_n_sigma=2.0,
             repetition_penalty=1.2, frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=64,
             dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=128,
             xtc_probability=1.0, xtc_threshold=0.1, logit_bias={11: 3.0, "the": -2.0}),
        # Typical-p, but not after top-nσ: llama.cpp's top-nσ leaves its cuts in the array at -inf, and its
        # typical-p then computes 0 * log(0) = NaN for the entropy and keeps every token (a llama.cpp quirk).
        dict(temperature=0.7, dynatemp_range=0.3, dynatemp_exponent=1.5, top_k=100, typical_p=0.95, top_p=0.9,
             min_p=0.01, repetition_penalty=1.1, dry_multiplier=1.5, dry_allowed_length=3, dry_penalty_last_n=64,
             logit_bias={"\n": -1.0}),
    ],
)
def test_the_chain_in_llamacpps_default_order(vocab, tokenizer, settings):
    s = SamplerSettings(seed=0, **settings)
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    hist = history_with_repeats(vocab.n, newline)
    pairs = [(t, b) for k, b in s.logit_bias for t in ([k] if isinstance(k, int) else vocab.tokenize(k))]
    last_n = s.dry_penalty_last_n
    for x in rows(vocab.n, seed=7):
        theirs_s = chain(
            _llama_bias(vocab, pairs),
            Sampler(L.llama_sampler_init_penalties(vocab.n, s.penalty_last_n, s.repetition_penalty,
                                                   s.frequency_penalty, s.presence_penalty)),
            _llama_dry(vocab, s.dry_multiplier, s.dry_base, s.dry_allowed_length, last_n if last_n > 0 else 0,
                       s.dry_sequence_breakers),
            Sampler(L.llama_sampler_init_top_n_sigma(s.top_n_sigma)),
            Sampler(L.llama_sampler_init_top_k(s.top_k)),
            Sampler(L.llama_sampler_init_typical(s.typical_p, 0)),
            Sampler(L.llama_sampler_init_top_p(s.top_p, 0)),
            Sampler(L.llama_sampler_init_min_p(s.min_p, 0)),
            Sampler(L.llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, 0, SEED)),
            Sampler(L.llama_sampler_init_temp_ext(s.temperature, s.dynatemp_range, s.dynatemp_exponent)),
        ).accept(hist)
        compare(survivors(SamplerChain(s, vocab=tokenizer), x, hist), apply(theirs_s, x))


@pytest.mark.model
def test_mirostat_2_chain_replays_with_the_same_seed(vocab, tokenizer):
    s = SamplerSettings(temperature=0.9, mirostat=2, mirostat_tau=4.0, seed=42)
    xs = rows(vocab.n, seed=8) * 3

    def run():
        c = SamplerChain(s, vocab=tokenizer)
        return [c.pick(x, np.zeros(0, np.int64), top_n=0).token_id for x in xs], c.state()

    first, state = run()
    assert (first, state) == run()
    assert state != SamplerChain(s, vocab=tokenizer).state() == (8.0,)  # mu = 2 * tau at the start, then it learned
