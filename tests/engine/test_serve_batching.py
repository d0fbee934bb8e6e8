"""Several clients at once share the model's batch (issue 34, item 5), and each still gets its own answer.

The default model (llama.cpp, which has batch runners) on 127.0.0.1. A long answer holds the model while four
clients with different settings (chat and text completion, streamed and whole, one asking n = 2) queue behind
it; when it stops, the four run as rows of one batch. Each choice must be the answer the engine gives alone for
that request and seed, token for token, and say in its fingerprint that it was decoded in a batch of five rows.
A client that goes away in the middle of a shared batch ends alone; the model is free once the batch is done.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import httpx
import pytest

from serve_helpers import served_default_model

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


def hold_the_model(server, sink) -> tuple[str, threading.Thread]:
    """A long streamed answer that holds the model until stopped; returns its exchange id and reader."""
    sink.clear()
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", server.url + "/completions", timeout=120, json={
                "prompt": "Count: 1, 2, 3,", "max_tokens": 3000, "ignore_eos": True, "stream": True}) as r:
            for _ in r.iter_lines():
                started.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert started.wait(60)
    return sink.wait_starts(1)[0].id, thread


def post(server, path: str, body: dict, out: dict, key: str) -> threading.Thread:
    def run() -> None:
        if body.get("stream"):
            with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
                out[key] = [line for line in r.iter_lines() if line.startswith("data:")]
        else:
            out[key] = httpx.post(server.url + path, json=body, timeout=120).json()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


BODIES = {
    "chat": ("/chat/completions", {"messages": [{"role": "user", "content": "Name three colours."}],
                                   "max_tokens": 12, "temperature": 0.9, "seed": 5}),
    "chat-n2": ("/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                                      "n": 2, "top_k": 20, "seed": 9, "stream": True}),
    "text": ("/completions", {"prompt": "The capital of France is", "max_tokens": 10, "temperature": 0,
                              "seed": 1}),
    "text-stream": ("/completions", {"prompt": "Once upon a time", "max_tokens": 14, "min_p": 0.1, "seed": 77,
                                     "stream": True}),
}


def test_clients_waiting_together_share_one_batch_and_get_their_own_answers(served):
    engine, server, sink = served
    holder, reader = hold_the_model(server, sink)
    out: dict = {}
    threads = [post(server, path, body, out, key) for key, (path, body) in BODIES.items()]
    sink.wait_starts(1 + len(BODIES))
    assert server.stop_request(holder)  # the model is free: the four waiting requests take it together
    for t in threads + [reader]:
        t.join(120)
    assert sorted(out) == sorted(BODIES)
    ended = [ex for ex in sink.wait_ends(1 + len(BODIES)) if ex.id != holder]
    assert len(ended) == len(BODIES)
    for ex in ended:
        for choice in ex.choices:
            stats = choice.stats
            assert stats is not None and stats.fingerprint is not None, ex.body
            assert stats.fingerprint.extras["batch_rows"] == 5, ex.body  # 1 + 2 + 1 + 1 rows in one batch
            alone = engine.complete(replace(ex.request, sampler=ex.request.sampler.with_(seed=stats.seed)))
            assert alone.token_ids == stats.token_ids and alone.text == stats.text, ex.body
    # What the clients were told is what was recorded.
    whole = {ex.body.get("prompt") or ex.body["messages"][0]["content"]: ex for ex in ended}
    assert out["text"]["choices"][0]["text"] == whole["The capital of France is"].choices[0].text
    assert out["chat"]["choices"][0]["message"]["content"] == whole["Name three colours."].choices[0].text
    assert sum('"finish_reason":"' in line for line in out["chat-n2"]) == 2  # both choices ended


def test_a_client_leaving_a_shared_batch_ends_alone_and_the_model_is_free_after(served):
    engine, server, sink = served
    holder, reader = hold_the_model(server, sink)
    out: dict = {}
    stayer = post(server, "/completions", {"prompt": "Once upon a time", "max_tokens": 40, "seed": 3}, out, "s")
    left: list[str] = []

    def leave_after_three() -> None:
        with httpx.stream("POST", server.url + "/completions", timeout=120, json={
                "prompt": "Count: 1, 2, 3,", "max_tokens": 2000, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    left.append(line)
                if len(left) == 3:
                    return  # the client closes the connection

    leaver = threading.Thread(target=leave_after_three, daemon=True)
    leaver.start()
    starts = sink.wait_starts(3)
    assert server.stop_request(holder)
    for t in (leaver, stayer, reader):
        t.join(120)
    ended = {ex.id: ex for ex in sink.wait_ends(3)}
    gone = ended[starts[2].id] if ended[starts[2].id].body.get("stream") else ended[starts[1].id]
    stayed = ended[starts[1].id] if gone is ended[starts[2].id] else ended[starts[2].id]
    assert gone.disconnected and len(gone.choices[0].events) < 100
    stats = stayed.choices[0].stats
    assert stats is not None and stats.fingerprint.extras["batch_rows"] == 2 and stats.generated_tokens == 40
    alone = engine.complete(replace(stayed.request, sampler=stayed.request.sampler.with_(seed=stats.seed)))
    assert alone.token_ids == stats.token_ids
    # The model is free again: a request now runs at once (alone: nothing waits with it).
    r = httpx.post(server.url + "/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None


class FailingRunner:
    """The model's batch runner, failing on its third step (a runtime error inside the model)."""

    def __init__(self, runner) -> None:
        self._r, self.steps = runner, 0
        self.pad_id, self.reorder, self.start, self.close = runner.pad_id, runner.reorder, runner.start, runner.close

    @property
    def forward_calls(self) -> int:
        return self._r.forward_calls

    @property
    def reused_prompt_tokens(self) -> tuple[int, ...]:
        return self._r.reused_prompt_tokens

    def step(self, tokens):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("llama_decode returned -3")
        return self._r.step(tokens)


def test_a_batch_that_fails_ends_every_clients_stream_with_an_error_event(served, monkeypatch):
    engine, server, sink = served
    backend = engine.wait_ready()
    original = backend.batch_runner
    monkeypatch.setattr(backend, "batch_runner", lambda: FailingRunner(original()))
    holder, reader = hold_the_model(server, sink)
    out: dict = {}
    threads = [post(server, "/completions", {"prompt": f"Story {i}:", "max_tokens": 20, "stream": True}, out, i)
               for i in range(2)]
    sink.wait_starts(3)
    assert server.stop_request(holder)
    for t in threads + [reader]:
        t.join(120)
    for i in range(2):
        lines = out[i]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert '"error"' in lines[-2] and "llama_decode returned -3" in lines[-2], lines[-3:]
    monkeypatch.setattr(backend, "batch_runner", original)
    r = httpx.post(server.url + "/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200  # the model is free and answers again
