"""Continuous batching on the server: a request that comes while a shared batch runs joins it at once.

The default model (llama.cpp) on 127.0.0.1. Two requests wait behind a long answer and then run as one batch
(one of them long); a third that comes while that batch runs joins it, and is answered while the long one
still runs, with the answer the engine gives alone. Once the window's own chat waits for the model, the batch
takes no newcomers: a fourth request waits for its own turn and runs alone, after the window's chat (as a
batch of its own, which later requests could join, since it had to wait).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import httpx
import pytest

from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings
from serve_helpers import served_default_model
from test_serve_batching import hold_the_model, post

pytestmark = [pytest.mark.model, pytest.mark.slow]


def wait_tokens(sink, exchange_id: str, n: int, timeout: float = 60.0) -> int:
    """Wait until the exchange has recorded at least `n` tokens; returns how many it has."""
    deadline = time.monotonic() + timeout
    while len(sink.tokens.get(exchange_id, ())) < n:
        assert time.monotonic() < deadline, f"fewer than {n} tokens within {timeout} s"
        time.sleep(0.01)
    return len(sink.tokens[exchange_id])


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


def test_a_request_that_comes_while_a_batch_runs_joins_it(served):
    engine, server, sink = served
    holder, reader = hold_the_model(server, sink)
    out: dict = {}
    long_body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    threads = [post(server, "/completions", long_body, out, "a"),
               post(server, "/completions", {"prompt": "Hi", "max_tokens": 4, "seed": 2}, out, "b")]
    starts = sink.wait_starts(3)
    assert server.stop_request(holder)  # the two waiting requests take the model as one batch
    long_id = next(ex.id for ex in starts[1:] if ex.body.get("max_tokens") == 3000)
    wait_tokens(sink, long_id, 3)  # that batch runs

    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8, "temperature": 0}
    answer = httpx.post(server.url + "/chat/completions", json=chat, timeout=120)
    assert answer.status_code == 200
    assert long_id not in [ex.id for ex in sink.ended]  # answered while the long one still runs
    joined = next(ex for ex in sink.ended if ex.body.get("messages"))
    stats = joined.choices[0].stats
    assert stats is not None and stats.fingerprint is not None
    assert stats.fingerprint.extras["batch_rows"] == 3  # the long one, the short one, and this one
    assert answer.json()["choices"][0]["message"]["content"] == stats.text

    # The window's chat now waits for the model: from the batch's next step on, it takes no newcomers.
    window_events: list = []
    engine.submit(GenerationRequest(prompt="Hello", max_new_tokens=3, sampler=SamplerSettings(temperature=0)),
                  lambda event: window_events.append((time.time(), event)))
    wait_tokens(sink, long_id, len(sink.tokens[long_id]) + 3)
    threads.append(post(server, "/completions", {"prompt": "Hi there", "max_tokens": 3, "temperature": 0},
                        out, "d"))
    late = sink.wait_starts(5)[4]
    wait_tokens(sink, long_id, len(sink.tokens[long_id]) + 3)  # the batch goes on without it
    assert late.id not in [ex.id for ex in sink.ended]
    assert server.stop_request(long_id)
    for t in threads + [reader]:
        t.join(120)
    ended = {ex.id: ex for ex in sink.wait_ends(5)}
    alone_stats = ended[late.id].choices[0].stats
    assert alone_stats is not None and alone_stats.fingerprint.extras["batch_rows"] == 1  # a turn of its own
    window_done_at, window_done = window_events[-1]
    assert isinstance(window_done, Done) and window_done.stats.finish_reason == "length"
    assert window_done_at <= ended[late.id].finished_at  # the window's chat went first

    # The joined answer is the one the engine gives alone.
    alone = engine.complete(replace(joined.request, sampler=joined.request.sampler.with_(seed=stats.seed)))
    assert alone.token_ids == stats.token_ids and alone.text == stats.text


def test_a_request_that_waited_alone_runs_as_a_batch_that_a_later_one_joins(served):
    """One request waits behind the first: it runs as a batch of one (it found the model busy, so more may
    come), and a request that comes while it runs joins it."""
    engine, server, sink = served
    holder, reader = hold_the_model(server, sink)
    out: dict = {}
    waiter = post(server, "/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": 3000, "ignore_eos": True,
                                           "stream": True}, out, "a")
    long_id = sink.wait_starts(2)[1].id
    assert server.stop_request(holder)
    wait_tokens(sink, long_id, 3)
    answer = httpx.post(server.url + "/completions", json={"prompt": "The sky is", "max_tokens": 6,
                                                          "temperature": 0}, timeout=120)
    assert answer.status_code == 200 and long_id not in [ex.id for ex in sink.ended]
    joined = next(ex for ex in sink.ended if ex.body.get("prompt") == "The sky is")
    assert joined.choices[0].stats.fingerprint.extras["batch_rows"] == 2
    assert server.stop_request(long_id)
    for t in (waiter, reader):
        t.join(120)
