"""The public stage hook: a function `logprobs, history -> logprobs` at a named place in the sampler order.

Checked on the chain itself (what it sees, where it runs, how it is recorded), through the decode loop and
the research API on a tiny random-weight Llama, and at every place settings leave Python (saved settings,
llama.cpp JSON, a server that samples itself), where it must be refused in words, never dropped.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine import CustomStage, CustomStageError, SamplerChain, SamplerSettings, TokenProb, final_distribution
from engine.backends.remote.errors import UnsupportedByServerError
from engine.backends.remote.server_params import server_parameters
from engine.decode.loop import generate_events
from engine.events import TokenEvent
from engine.request import GenerationRequest
from engine.sampling.llamacpp_json import llamacpp_json

V = 500


def logits(seed: int = 0, v: int = V) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(v).astype(np.float32) * 3.0
    x[rng.choice(v, 5, replace=False)] += 8.0  # a few strong candidates, like a language model's row
    return x


def banning(token: int):
    def ban(logprobs: np.ndarray, history: np.ndarray) -> np.ndarray:
        logprobs[token] = -np.inf
        return logprobs

    return ban


def test_a_banned_token_is_never_drawn_and_its_stage_is_recorded_under_its_name():
    x = logits()
    top = int(np.argmax(x))
    settings = SamplerSettings(temperature=1.5, top_k=20, seed=7).with_stage("no_top", banning(top), after="top_k")
    chain = SamplerChain(settings)
    assert chain.stage_names == ("top_k", "no_top", "temperature")
    p_top = math.exp(float(x[top]) - float(np.logaddexp.reduce(x.astype(np.float64))))
    assert p_top > 0.3  # without the hook the top token would be drawn often
    for _ in range(300):
        pick = chain.pick(x, np.arange(3), top_n=20, record_stages=True)
        assert pick.token_id != top
        top_k, hook, _temp = pick.stages
        assert hook.name == "no_top"
        assert hook.survivors == top_k.survivors - 1 and hook.removed == (top,)
        assert top not in [p.token_id for p in hook.top] and top in [p.token_id for p in top_k.top]
        assert top not in [p.token_id for p in pick.top_sampler]
    # mass_kept is the top token's share of the distribution after top_k
    kept = np.sort(x.astype(np.float64))[-20:]
    share = math.exp(float(x[top]) - float(np.logaddexp.reduce(kept)))
    assert hook.mass_kept == pytest.approx(1 - share, abs=1e-6)


def test_hooks_run_where_the_order_puts_them_and_see_normalised_logprobs():
    seen: list[tuple[str, int, float]] = []

    def watch(name):
        def fn(logprobs, history):
            finite = logprobs[np.isfinite(logprobs)]
            seen.append((name, finite.size, float(np.logaddexp.reduce(finite.astype(np.float64)))))
            return logprobs

        return fn

    s = (SamplerSettings(top_k=7, temperature=0.5, seed=1)
         .with_stage("before", watch("before"), before="top_k")
         .with_stage("after", watch("after"), after="top_k")
         .with_stage("last", watch("last")))
    assert s.order.index("before") < s.order.index("top_k") < s.order.index("after") < s.order.index("temperature")
    assert s.order[-1] == "last"
    chain = SamplerChain(s)
    assert chain.stage_names == ("before", "top_k", "after", "temperature", "last")
    chain.pick(logits(3), np.arange(4))
    assert [n for n, _, _ in seen] == ["before", "after", "last"]
    assert [k for _, k, _ in seen] == [V, 7, 7]  # the whole row before top_k, its 7 survivors after
    assert all(abs(lse) < 1e-5 for _, _, lse in seen)  # log-probs: they sum to one


def test_a_hook_that_changes_nothing_changes_no_pick_and_is_recorded_as_unchanged():
    s = SamplerSettings(temperature=0.9, top_p=0.9, seed=11)
    hooked = s.with_stage("noop", lambda lp, h: lp, after="top_p")
    a, b = SamplerChain(s), SamplerChain(hooked)
    for step in range(50):
        x = logits(step)
        pa = a.pick(x, np.arange(step), top_n=5, record_stages=True)
        pb = b.pick(x, np.arange(step), top_n=5, record_stages=True)
        assert pa.token_id == pb.token_id and pa.top_sampler == pb.top_sampler
        noop = pb.stages[[st.name for st in pb.stages].index("noop")]
        assert noop.mass_kept == 1.0 and noop.removed == ()


def test_tokens_the_hook_leaves_keep_their_logits_for_the_stages_after_it():
    """A repetition penalty divides a positive logit and multiplies a negative one: it must see the logits'
    own scale after a hook, not the log-probs the hook was given."""
    x = logits(5) + 4.0
    history = np.arange(0, V, 2)
    low = int(np.argmin(x))
    s = SamplerSettings(repetition_penalty=1.5, penalty_last_n=-1, seed=0)
    hooked = s.with_stage("ban_low", banning(low), before="penalties")
    plain, with_hook = final_distribution(x, history, s), final_distribution(x, history, hooked)
    assert with_hook[low] == -np.inf
    keep = np.arange(V) != low
    renorm = plain[keep] - np.logaddexp.reduce(plain[keep].astype(np.float64))
    np.testing.assert_allclose(with_hook[keep], renorm, atol=1e-5)


def test_final_distribution_is_what_the_draw_used():
    x = logits(9)
    s = SamplerSettings(top_k=10, temperature=0.7, seed=3)
    final = final_distribution(x, (), s)
    top10 = np.argsort(-x)[:10]
    expected = np.full(V, -np.inf)
    z = x[top10].astype(np.float64) / 0.7
    expected[top10] = z - np.logaddexp.reduce(z)
    np.testing.assert_allclose(final, expected, atol=1e-5)
    # The chain's draw: u from the seeded PCG64 stream, inverse CDF over the survivors in id order.
    u = np.random.default_rng(3).random()
    cdf = np.cumsum(np.exp(final.astype(np.float64)))
    drawn = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    assert SamplerChain(s).pick(x, np.zeros(0, dtype=np.int64)).token_id == drawn
    # Greedy: all the mass on the token greedy takes; with a hook, the banned token is out.
    greedy = final_distribution(x, (), SamplerSettings(temperature=0).with_stage("b", banning(int(np.argmax(x)))))
    assert np.count_nonzero(np.isfinite(greedy)) == 1 and greedy[int(np.argsort(-x)[1])] == 0.0


def test_alternatives_are_token_probs_everywhere():
    class Names:
        def token_text(self, token_id: int) -> str:
            return f"<{token_id}>"

    pick = SamplerChain(SamplerSettings(top_k=5, seed=0), vocab=Names()).pick(logits(), np.arange(2), top_n=3,
                                                                                record_stages=True)
    for alternatives in (pick.top_model, pick.top_sampler, *(st.top for st in pick.stages)):
        assert alternatives and all(isinstance(p, TokenProb) for p in alternatives)
        assert all(p.text == f"<{p.token_id}>" for p in alternatives)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda s: s.with_stage("top_k", lambda lp, h: lp), "built-in stage's"),
        (lambda s: s.with_stage("x", lambda lp, h: lp).with_stage("x", lambda lp, h: lp), "two custom stages"),
        (lambda s: s.with_stage("x", "not a function"), "needs a function"),
        (lambda s: s.with_(custom_stages=(CustomStage("lost", lambda lp, h: lp),)), "not in the order"),
        (lambda s: s.with_stage("x", lambda lp, h: lp, after="nowhere"), "not in the order"),
        (lambda s: s.with_(order=("top_k", "mystery")), "unknown sampler stages"),
        (lambda s: s.with_(custom_stages=("not a stage",)), "list of CustomStage"),
    ],
)
def test_bad_custom_stages_are_refused_in_words(make, words):
    with pytest.raises(ValueError, match=words):
        make(SamplerSettings())


@pytest.mark.parametrize(
    "returns, words",
    [
        (lambda lp: np.full_like(lp, np.nan), "NaN or \\+inf"),
        (lambda lp: lp[:10], "shape"),
        (lambda lp: np.full_like(lp, -np.inf), "removed every token"),
        (lambda lp: "text", "must return"),
    ],
)
def test_a_hook_returning_nonsense_names_itself(returns, words):
    s = SamplerSettings(seed=0).with_stage("mine", lambda lp, h: returns(lp))
    with pytest.raises(ValueError, match=f"custom stage 'mine'.*{words}|{words}.*'mine'"):
        SamplerChain(s).pick(logits(), np.arange(3))


def test_the_history_a_hook_sees_is_read_only():
    def scribble(lp, history):
        history[0] = 99
        return lp

    history = np.arange(5, dtype=np.int64)
    with pytest.raises(ValueError, match="read-only") as err:
        SamplerChain(SamplerSettings(seed=0).with_stage("scribble", scribble)).pick(logits(), history)
    assert "'scribble'" in "".join(getattr(err.value, "__notes__", ()))
    assert history.tolist() == [0, 1, 2, 3, 4]


def test_a_custom_stage_is_refused_in_words_wherever_settings_leave_python():
    s = SamplerSettings(temperature=0.7).with_stage("no_the", banning(3), after="top_k")
    with pytest.raises(CustomStageError, match="'no_the' is Python code.*saved settings"):
        s.to_dict()
    with pytest.raises(CustomStageError, match="'no_the' is Python code.*llama.cpp JSON"):
        llamacpp_json(s)
    for kind in ("llama.cpp", "vllm"):
        with pytest.raises(UnsupportedByServerError, match="custom stage 'no_the'"):
            server_parameters(s, kind, seed_supported=True)
    with pytest.raises(CustomStageError, match="custom_stages cannot come from saved settings"):
        SamplerSettings.from_dict({"custom_stages": [], "temperature": 0.5})
    plain = s.without_custom_stages()
    assert "no_the" not in plain.order and plain.custom_stages == ()
    assert SamplerSettings.from_dict(plain.to_dict()) == plain


# --- through the decode loop and the research API, on a tiny random-weight Llama --------------------------------


def test_the_decode_loop_records_the_hook_and_never_emits_the_banned_token(tiny_torch):
    greedy = SamplerSettings(temperature=0.0)
    first = [e for e in generate_events(tiny_torch, GenerationRequest(prompt="hello there", sampler=greedy,
                                                                      max_new_tokens=1)) if isinstance(e, TokenEvent)]
    banned = first[0].token_id
    s = SamplerSettings(temperature=0.9, top_k=40, seed=2).with_stage("ban", banning(banned), after="top_k")
    events = [e for e in generate_events(tiny_torch, GenerationRequest(prompt="hello there", sampler=s,
                                                                       max_new_tokens=12, record_stages=True))
              if isinstance(e, TokenEvent)]
    assert len(events) == 12 and banned not in [e.token_id for e in events]
    for e in events:
        assert [st.stage for st in e.stages] == ["top_k", "ban", "temperature"]
        assert all(p.token_id != banned for p in e.top_sampler)
    assert banned in events[0].stages[1].removed  # the model's top pick at the first step, cut by the hook


def test_the_research_api_takes_a_hook(tiny_torch):
    from engine.research import LanguageModel

    lm = LanguageModel(tiny_torch)
    try:
        prompt = [5, 17, 99, 1203]
        plain = lm.generate([prompt], max_new_tokens=6, stop=())[0, len(prompt):].tolist()
        banned = plain[0]
        s = SamplerSettings(temperature=0.0).with_stage("ban", banning(banned))
        out = lm.generate([prompt], max_new_tokens=6, stop=(), sampler=s)[0, len(prompt):].tolist()
        assert banned not in out and out != plain
        ids, _ = lm.sample(prompt, max_tokens=6, sampler=s.with_(temperature=1.0, seed=4))
        assert banned not in ids
        for ids, _ in lm.batch_sample([prompt, prompt[:2]], max_tokens=6, sampler=s.with_(temperature=1.0, seed=4)):
            assert banned not in ids
    finally:
        lm._executor.shutdown()
