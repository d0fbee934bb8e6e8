"""Banned strings: the guard that holds text back, and the decode loop that steps back and bans a token."""

from __future__ import annotations

import math

import pytest

from engine.banned_strings import Ban, BannedStringGuard
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


# ---------------------------------------------------------------------- the guard


def test_guard_holds_a_possible_phrase_back_from_the_token_where_it_starts():
    g = BannedStringGuard(["shivers down"])
    assert g.feed(0, "It sent") == ("It sent", None)
    assert g.feed(1, " shi") == ("", None)  # " shi" could become the phrase: held from this token's start
    assert g.held_from == 1
    assert g.feed(2, "vers") == ("", None)
    assert g.feed(3, " up") == (" shivers up", None)  # cannot become it anymore: released
    assert g.held_from == 4


def test_guard_finds_the_phrase_and_the_token_it_began_in():
    g = BannedStringGuard(["a tapestry", "testament"])
    assert g.feed(0, "Life is") == ("Life is", None)
    assert g.feed(1, " a tap") == ("", None)
    assert g.feed(2, "estry") == ("", Ban("a tapestry", 1))
    g.rewind(1)
    assert g.feed(1, " rich") == (" rich", None)
    assert g.finish() == ""


def test_guard_a_character_split_over_tokens_belongs_to_the_first_of_them():
    g = BannedStringGuard(["é!"])
    g.feed(0, "ok ")
    g.feed(1, "")  # ended inside "é": no text yet
    assert g.feed(2, "é") == ("", None)
    assert g.feed(3, "!") == ("", Ban("é!", 1))


def test_guard_releases_what_it_holds_at_the_end_and_when_it_gives_up():
    g = BannedStringGuard(["the end"])
    g.feed(0, "almost the")
    assert g.finish(" e") == "almost the e"
    g = BannedStringGuard(["xy"])
    g.feed(0, "x")
    assert g.feed(1, "y")[1] == Ban("xy", 0)
    assert g.give_up() == "xy"
    assert g.feed(2, "xy") == ("xy", None)


# ----------------------------------------------------------------- the decode loop


def run(backend, **kwargs) -> tuple[list[TokenEvent], Done]:
    events = list(generate_events(backend, GenerationRequest(**kwargs)))
    assert isinstance(events[-1], Done) and all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def kept(events: list[TokenEvent]) -> list[TokenEvent]:
    """The events that stand: a rewind voids the earlier events from its index on."""
    out: list[TokenEvent] = []
    for e in events:
        if e.rewind is not None:
            del out[e.index :]
        out.append(e)
    return out


@pytest.mark.slow
def test_a_banned_phrase_makes_the_loop_step_back_ban_its_first_token_and_go_on(fresh_default_torch):
    backend = fresh_default_torch
    prompt = "Once upon a time, in a small village by the sea,"
    free_events, free = run(backend, prompt=prompt, sampler=GREEDY, max_new_tokens=24)
    words = free.stats.text.split()
    phrase = " ".join(words[3:5])  # two words from the middle of the greedy answer
    at = free.stats.text.index(phrase)

    events, done = run(backend, prompt=prompt, sampler=GREEDY.with_(banned_strings=(phrase,)), max_new_tokens=24)
    text = done.stats.text
    assert phrase not in text
    assert "".join(e.text for e in events) == text  # released text is never taken back
    assert text[:at] == free.stats.text[:at]  # greedy: the same up to where the phrase began
    rewinds = [e for e in events if e.rewind is not None]
    assert rewinds and rewinds[0].rewind.phrase == phrase
    first = rewinds[0]
    banned = first.rewind.banned_token_id
    assert banned == free.stats.token_ids[first.index]  # the token the phrase began with, in the free run
    assert first.token_id != banned
    assert [e.token_id for e in kept(events)] == list(done.stats.token_ids)
    assert len(done.stats.token_ids) == 24

    # The cache was trimmed right: a fresh run forced through the same tokens reports the same log-probs.
    replay, _ = run(backend, prompt=prompt, sampler=GREEDY, max_new_tokens=24, forced_tokens=done.stats.token_ids)
    for a, b in zip(kept(events), replay, strict=True):
        assert a.token_id == b.token_id
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4)


@pytest.mark.slow
def test_banned_strings_with_a_seed_replay_to_the_same_answer(fresh_default_torch):
    s = SamplerSettings(temperature=0.9, mirostat=2, seed=7, banned_strings=(" the", " a "))
    one = run(fresh_default_torch, prompt="Write about the sea:", sampler=s, max_new_tokens=20)[1].stats
    two = run(fresh_default_torch, prompt="Write about the sea:", sampler=s, max_new_tokens=20)[1].stats
    assert one.token_ids == two.token_ids and " the" not in one.text and " a " not in one.text
