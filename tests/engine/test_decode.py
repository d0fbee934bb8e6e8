"""The decode loop: events, stopping, context limits, UTF-8 streaming, forcing and continuing."""

from __future__ import annotations

import math

import pytest

from engine.decode.loop import generate_events
from engine.errors import ContextLengthError
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


def run(backend, **kwargs) -> tuple[list[TokenEvent], Done]:
    events = list(generate_events(backend, GenerationRequest(**kwargs)))
    assert isinstance(events[-1], Done) and all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def test_events_carry_consistent_inspection(tiny_torch):
    tokens, done = run(tiny_torch, prompt="hello there", sampler=SamplerSettings(temperature=0.9, top_k=40, seed=3),
                       max_new_tokens=12, top_n=8, record_stages=True)
    assert done.stats.generated_tokens == len(tokens) == 12 and done.stats.finish_reason == "length"
    for e in tokens:
        assert e.logprob <= 0 and e.sampler_logprob <= 1e-6 and e.entropy >= 0
        probs = [a.logprob for a in e.top_model]
        assert probs == sorted(probs, reverse=True) and len(probs) == 8
        if e.rank < 8:
            assert e.top_model[e.rank].token_id == e.token_id
            assert math.isclose(e.top_model[e.rank].logprob, e.logprob, abs_tol=1e-5)
        assert [s.stage for s in e.stages] == ["top_k", "temperature"]  # neutral stages are skipped
    assert "".join(e.text for e in tokens) == done.stats.text


def test_same_seed_same_tokens_and_seed_is_reported(tiny_torch):
    s = SamplerSettings(temperature=1.0, seed=1234)
    a = run(tiny_torch, prompt="once upon a time", sampler=s, max_new_tokens=16)[1].stats
    b = run(tiny_torch, prompt="once upon a time", sampler=s, max_new_tokens=16)[1].stats
    assert a.token_ids == b.token_ids and a.seed == b.seed == 1234
    c = run(tiny_torch, prompt="once upon a time", sampler=s.with_(seed=None), max_new_tokens=16)[1].stats
    replay = run(tiny_torch, prompt="once upon a time", sampler=s.with_(seed=c.seed), max_new_tokens=16)[1].stats
    assert replay.token_ids == c.token_ids


def test_prompt_longer_than_context_names_both_numbers(tiny_torch):
    ids = tuple(range(100, 130))
    with pytest.raises(ContextLengthError) as err:
        run(tiny_torch, prompt_ids=ids, max_new_tokens=500)
    assert all(str(n) in str(err.value) for n in (30, 500, 512))


def test_stop_string_ends_generation_and_is_not_emitted(fresh_default_torch):
    tokens, done = run(fresh_default_torch, prompt="The capital of France is", sampler=GREEDY,
                       max_new_tokens=16, stop=(".",))
    assert done.stats.finish_reason == "stop"
    assert "Paris" in done.stats.text and "." not in done.stats.text
    assert "".join(e.text for e in tokens) == done.stats.text


def test_chat_answer_ends_on_eos(fresh_default_torch):
    tokens, done = run(fresh_default_torch, messages=({"role": "user", "content": "Say hello."},),
                       sampler=GREEDY, max_new_tokens=64)
    assert done.stats.finish_reason == "eos"
    assert tokens[-1].special and tokens[-1].token_id in fresh_default_torch.tokenizer.eos_token_ids
    assert tokens[-1].text == "" and "<|im_end|>" not in done.stats.text


def test_multibyte_characters_split_across_tokens_stream_cleanly(fresh_default_torch):
    tok = fresh_default_torch.tokenizer
    text = " 日本語 🎉 café — naïve"
    ids = tok.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tok.token_text(i) for i in ids)  # the test is only worth it if bytes are split
    tokens, done = run(fresh_default_torch, prompt="Write:", sampler=GREEDY, max_new_tokens=len(ids),
                       forced_tokens=tuple(ids))
    assert all(e.forced for e in tokens)
    assert all("\ufffd" not in e.text for e in tokens)
    assert "".join(e.text for e in tokens) == tok.decode(ids) == done.stats.text


def test_forced_token_is_inspected_and_generation_continues_from_it(fresh_default_torch):
    tok = fresh_default_torch.tokenizer
    prompt = "The capital of France is"
    greedy, _ = run(fresh_default_torch, prompt=prompt, sampler=GREEDY, max_new_tokens=3, top_n=5)
    alt = greedy[0].top_model[1]  # the model's second choice
    tokens, done = run(fresh_default_torch, prompt=prompt, sampler=GREEDY, max_new_tokens=3, top_n=5,
                       forced_tokens=(alt.token_id,))
    assert tokens[0].forced and tokens[0].token_id == alt.token_id and tokens[0].rank == 1
    assert math.isclose(tokens[0].logprob, alt.logprob, abs_tol=1e-5)
    assert not tokens[1].forced and done.stats.token_ids[0] == alt.token_id
    assert done.stats.reused_tokens == len(tok.encode(prompt)) - 1  # the branch reused the prompt's cache


def test_continue_from_assistant_prefix_matches_uninterrupted_run(fresh_default_torch):
    msgs = ({"role": "user", "content": "Count from one to ten in words."},)
    whole, done = run(fresh_default_torch, messages=msgs, sampler=GREEDY, max_new_tokens=12)
    first = done.stats.token_ids[:5]
    rest, done2 = run(fresh_default_torch, messages=msgs, sampler=GREEDY, max_new_tokens=7, assistant_prefix=first)
    assert first + done2.stats.token_ids == done.stats.token_ids
