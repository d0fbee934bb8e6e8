"""The Engine methods the window uses instead of running its own code on the backend (issue 32 item 4), on the
default model: each gives what the engine's own function gives on the backend, and step mode is `submit(step=)`."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine import Done, Engine, GenerationRequest, SamplerSettings, TokenEvent, lens, loom
from engine.fingerprints.taking import rows_with_fingerprint

pytestmark = [pytest.mark.model, pytest.mark.slow]

MESSAGES = ({"role": "user", "content": "Name three colours."},)


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("llama_cpp")
    with Engine.load(None, backend="llamacpp") as eng:
        yield eng


def _request(**kw) -> GenerationRequest:
    base = dict(messages=MESSAGES, sampler=SamplerSettings(temperature=1.0, seed=7), max_new_tokens=6, top_n=5)
    return GenerationRequest(**{**base, **kw})


def test_layer_capture_is_the_lens_of_those_positions(engine):
    ids = list(engine.tokenizer.encode("The capital of France is Paris"))
    positions = [len(ids) - 2, len(ids) - 1]
    got = engine.start_layer_capture(ids, positions, top_k=4, attention=True).result(60)
    oracle = engine.call(lambda b: lens.capture(b, ids, positions, top_k=4, attention=True)).result(60)
    assert [c.position for c in got] == positions and [c.target_id for c in got] == [ids[p] for p in positions]
    for a, b in zip(got, oracle):
        assert [layer.top for layer in a.layers] == [layer.top for layer in b.layers]
        assert np.array_equal(a.target_probs, b.target_probs) and a.attention is not None
        assert np.array_equal(a.attention, b.attention)


def test_loom_rows_are_the_continuations_with_their_fingerprints_on_the_worker(engine):
    request, n = _request(), 3
    seen: list[loom.RowEvent] = []
    threads: set[str] = set()

    def on_event(ev: loom.RowEvent) -> None:
        threads.add(threading.current_thread().name)
        seen.append(ev)

    assert engine.start_loom_rows(request, n, on_event).result(120) is None  # ends after the last event
    oracle = engine.call(lambda b: list(rows_with_fingerprint(b, request, n, loom.continuation_events(b, request, n)))
                         ).result(120)
    assert threading.current_thread().name not in threads  # delivered on the model's thread
    assert [(e.row, e.event.token_id) for e in seen if isinstance(e.event, TokenEvent)] == [
        (e.row, e.event.token_id) for e in oracle if isinstance(e.event, TokenEvent)]
    done = [e.event.stats for e in seen if isinstance(e.event, Done)]
    assert len(done) == n and all(s.fingerprint is not None and s.fingerprint.extras["loom_rows"] == n for s in done)


def test_loom_rows_refused_in_words_reach_the_future(engine):
    with pytest.raises(ValueError, match="forced"):
        engine.start_loom_rows(_request(forced_tokens=(5,)), 2, lambda ev: None).result(60)


def test_step_mode_is_an_argument_of_submit(engine):
    waiting: list[TokenEvent] = []

    def show(preview: TokenEvent) -> None:  # the window: shown the distribution, the user takes the second token
        waiting.append(preview)
        gate.pick(preview.top_model[1].token_id)

    gate = loom.StepGate(show, poll_s=0.01)
    gate.set_stepping(True)
    request = _request(max_new_tokens=3)
    events: list = []
    engine.submit(request, events.append, step=gate).result.result(60)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(waiting) == 3 and [e.token_id for e in tokens] == [p.top_model[1].token_id for p in waiting]
    assert all(e.forced and e.rank == 1 for e in tokens)

    # Without the gate (or with step mode off) the same request is the sampler's own answer.
    gate.set_stepping(False)
    stepped_off: list = []
    engine.submit(request, stepped_off.append, step=gate).result.result(60)
    plain = engine.complete(request)
    assert [e.token_id for e in stepped_off if isinstance(e, TokenEvent)] == list(plain.token_ids)
