"""The decode loop's overlap: a token's report built while the next forward runs (OverlappedForward).

On the default model on llama.cpp: the events are the ones the loop makes
without the overlap, the helper really runs the report on another thread, and
a failing forward or a cancel still ends the answer as before.
"""

from __future__ import annotations

import threading

import pytest

from engine.capabilities import OverlappedForward
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings

BALANCED = SamplerSettings(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1, seed=5)


class Plain:
    """The same backend without `forward_during`: the loop runs forward after the event, as before."""

    def __init__(self, backend) -> None:
        self._b = backend

    def __getattr__(self, name):
        if name == "forward_during":
            raise AttributeError(name)
        return getattr(self._b, name)


def request(backend, **kw) -> GenerationRequest:
    ids = backend.tokenizer.chat_ids([{"role": "user", "content": "Name three colours."}])
    return GenerationRequest(prompt_ids=ids, sampler=BALANCED, max_new_tokens=24, ignore_eos=True,
                             top_n=10, record_stages=True, **kw)


@pytest.mark.slow
def test_llamacpp_overlaps_and_the_events_are_the_same(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    assert isinstance(backend, OverlappedForward) and not isinstance(Plain(backend), OverlappedForward)
    overlapped = list(generate_events(backend, request(backend)))
    backend.trim_cache(0)
    plain = list(generate_events(Plain(backend), request(backend)))
    tokens = [e for e in overlapped if isinstance(e, TokenEvent)]
    assert len(tokens) == 24 and tokens[0].stages  # every stage recorded
    assert tokens == [e for e in plain if isinstance(e, TokenEvent)]
    assert overlapped[-1].stats.token_ids == plain[-1].stats.token_ids


def test_forward_during_runs_the_work_on_another_thread(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    ids = backend.tokenizer.encode("The sky is")
    backend.forward(ids[:-1])
    logits, worker = backend.forward_during(ids[-1:], threading.get_ident)
    assert worker != threading.get_ident()
    assert logits.shape == (backend.n_vocab,)
    backend.trim_cache(0)
    assert (backend.forward(ids) == logits).all()  # the same forward


def test_a_forward_that_fails_after_a_token_keeps_the_token(fresh_default_llamacpp, monkeypatch):
    backend = fresh_default_llamacpp
    calls = []
    original = backend.forward

    def failing(ids):
        calls.append(ids)
        if len(calls) > 3:  # the prompt, two tokens, then the third token's forward fails
            raise ConnectionError("gone")
        return original(ids)

    monkeypatch.setattr(backend, "forward", failing)
    events = list(generate_events(backend, request(backend), recoverable=(ConnectionError,)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    done = events[-1]
    assert isinstance(done, Done) and done.stats.finish_reason == "error" and done.stats.error == "gone"
    assert len(tokens) == 3 and done.stats.token_ids == tuple(e.token_id for e in tokens)


@pytest.mark.parametrize("at", [0, 5])
def test_cancel_on_seeing_a_token_ends_the_answer_there(fresh_default_llamacpp, at):
    backend = fresh_default_llamacpp
    cancel = threading.Event()
    events = []
    for e in generate_events(backend, request(backend), cancel):
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == at:
            cancel.set()
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert events[-1].stats.finish_reason == "cancelled"
    assert [e.index for e in tokens] == list(range(at + 1))
    # the cache holds the prompt and every token seen: the last one's forward had run before its event came
    assert len(backend.cached_tokens()) - events[-1].stats.prompt_tokens == at + 1
