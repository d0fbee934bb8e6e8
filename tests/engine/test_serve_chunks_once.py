"""A served token costs the model's thread one queue put, and its chunk is the same bytes (issue 47 item 3).

- The model's worker thread never wakes the server's event loop itself (`loop.call_soon_threadsafe` there
  let the loop take the GIL and held the next forward until the loop had sent the token's chunk: 1-2 ms a
  token at 2 llama.cpp threads on 2 cores); `engine.serve.engine_run.HANDOFF`'s thread does it, for a lone
  answer, `n` > 1 and a shared batch.
- The stream's bytes are what they were: every `data:` line of a chat and a completions stream with
  `top_logprobs` 5 (greedy, seeded) equals the JSON the old chunk builder (kept below, as it was before this
  change) makes from the very events the sink was told.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import httpx
import pytest

from engine.serve.engine_run import HANDOFF
from serve_helpers import served_default_model

pytestmark = [pytest.mark.model, pytest.mark.slow]
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


def _data_lines(server, path: str, body: dict[str, Any]) -> list[str]:
    """The stream's `data:` payloads, exactly as sent."""
    out = []
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[len("data: "):])
    return out


# --- the chunk builder as it was before (engine/serve/responses.py at 45abea0), for the byte comparison -------

def _old_dumps(doc):
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def _old_lp(value):
    return value if math.isfinite(value) else -9999.0


def _old_bytes(text, raw):
    return list(raw if raw is not None else text.encode("utf-8", "surrogatepass"))


def _old_alternatives(event, top_logprobs):
    return tuple(p for p in event.top_model if not p.is_rest)[:top_logprobs]


def _old_chat_logprob(event, top_logprobs):
    return {
        "id": event.token_id, "token": event.token_text, "logprob": _old_lp(event.logprob),
        "bytes": _old_bytes(event.token_text, event.token_bytes),
        "top_logprobs": [{"id": p.token_id, "token": p.text, "logprob": _old_lp(p.logprob),
                          "bytes": _old_bytes(p.text, p.token_bytes)} for p in _old_alternatives(event, top_logprobs)],
    }


def _old_completion_logprobs(events, top_logprobs, offset):
    tokens, lps, tops, offsets = [], [], [], []
    for e in events:
        tokens.append(e.token_text)
        lps.append(_old_lp(e.logprob))
        top = {}
        for p in _old_alternatives(e, top_logprobs):
            top.setdefault(p.text, _old_lp(p.logprob))
        tops.append(top)
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets,
            "content": [_old_chat_logprob(e, top_logprobs) for e in events]}


def _old_doc(first: dict[str, Any], obj: str, choices):
    return {"id": first["id"], "object": obj, "created": first["created"], "model": first["model"],
            "choices": choices, "system_fingerprint": None}


# -----------------------------------------------------------------------------------------------------------

def test_a_chat_stream_with_top_logprobs_is_byte_identical_to_the_old_chunks(served):
    engine, server, sink = served
    sink.clear()
    lines = _data_lines(server, "/chat/completions", {
        "model": engine.info.name, "messages": CHAT, "max_tokens": 24, "temperature": 0, "seed": 7,
        "logprobs": True, "top_logprobs": 5, "stream": True})
    (ex,) = sink.wait_ends(1)
    events = [e for e in ex.choices[0].events if not e.special]
    assert len(events) >= 5 and lines[-1] == "[DONE]"
    first = json.loads(lines[0])
    expected = [_old_dumps(_old_doc(first, "chat.completion.chunk", [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]))]
    expected += [_old_dumps(_old_doc(first, "chat.completion.chunk", [
        {"index": 0, "delta": {"content": e.text}, "logprobs": {"content": [_old_chat_logprob(e, 5)]},
         "finish_reason": None}])) for e in events]
    expected.append(_old_dumps(_old_doc(first, "chat.completion.chunk", [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": ex.choices[0].finish_reason}])))
    assert lines[:-1] == expected
    assert all(len(json.loads(x)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 5
               for x in lines[1:-2])


def test_a_completions_stream_with_logprobs_is_byte_identical_to_the_old_chunks(served):
    engine, server, sink = served
    sink.clear()
    lines = _data_lines(server, "/completions", {
        "model": engine.info.name, "prompt": "The three primary colours are", "max_tokens": 24, "temperature": 0,
        "seed": 7, "logprobs": 5, "stream": True})
    (ex,) = sink.wait_ends(1)
    events = [e for e in ex.choices[0].events if not e.special]
    assert len(events) >= 5 and lines[-1] == "[DONE]"
    first = json.loads(lines[0])
    expected, offset = [], 0
    for e in events:
        expected.append(_old_dumps(_old_doc(first, "text_completion", [
            {"index": 0, "text": e.text, "logprobs": _old_completion_logprobs([e], 5, offset), "finish_reason": None}])))
        offset += len(e.text)
    expected.append(_old_dumps(_old_doc(first, "text_completion", [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": ex.choices[0].finish_reason}])))
    assert lines[:-1] == expected


def test_the_models_thread_never_wakes_the_servers_loop_itself(served):
    """Who calls the loop's `call_soon_threadsafe` while answers stream: never the model's worker thread (its
    events go through HANDOFF's queue), for one answer, `n` = 2 (the loom's rows) and answers that share a
    batch (two at once: the second waits and runs as a batch, which the first can join)."""
    engine, server, sink = served
    loop = server._loop
    callers: list[str] = []
    real = loop.call_soon_threadsafe

    def recording(*args, **kwargs):
        callers.append(threading.current_thread().name)
        return real(*args, **kwargs)

    loop.call_soon_threadsafe = recording
    try:
        sink.clear()
        name = engine.info.name
        one = {"model": name, "messages": CHAT, "max_tokens": 12, "temperature": 0.8, "seed": 1, "stream": True}
        assert _data_lines(server, "/chat/completions", one)[-1] == "[DONE]"
        assert _data_lines(server, "/chat/completions", dict(one, n=2))[-1] == "[DONE]"
        results: list[list[str]] = []
        clients = [threading.Thread(target=lambda: results.append(_data_lines(server, "/chat/completions", one)))
                   for _ in range(2)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        assert len(results) == 2 and all(r[-1] == "[DONE]" for r in results)
        ends = sink.wait_ends(4)
        assert len(ends) == 4 and all(c.events for ex in ends for c in ex.choices)
    finally:
        del loop.call_soon_threadsafe
    assert callers, "the events reached the loop some other way"
    assert "logitlab-model" not in callers
    assert HANDOFF._thread is not None and HANDOFF._thread.name in callers


def test_a_closed_loop_refuses_the_call_so_the_models_run_ends():
    # As loop.call_soon_threadsafe did on the worker: the error ends the run (engine.worker's delivery stops)
    # rather than the model generating on for a server that is gone.
    import asyncio

    from engine.serve.engine_run import Handoff

    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="event loop is closed"):
        Handoff().put(loop, print, "never")


def test_a_call_that_raises_does_not_drop_the_calls_after_it(caplog):
    # The hand-off joins calls that came together into one loop callback (`_call_each`); each still runs on its
    # own, as separate callbacks did, so a failing one cannot swallow an answer's end queued after it.
    from engine.serve.engine_run import _call_each

    seen: list[str] = []

    def fail() -> None:
        raise ValueError("a sink that fails")

    _call_each([(fail, ()), (seen.append, ("the answer's end",))])
    assert seen == ["the answer's end"]
    assert "could not be delivered" in caplog.text


def test_the_hand_off_thread_ends_when_idle_and_starts_again_for_the_next_call(monkeypatch):
    # A stopped server leaves no thread of its own behind (tests/app/test_serve_window.py looks for them).
    import asyncio
    import time

    from engine.serve.engine_run import Handoff

    monkeypatch.setattr(Handoff, "IDLE_S", 0.05)
    handoff = Handoff()
    loop = asyncio.new_event_loop()
    seen: list[int] = []
    threads = []
    try:
        for round_ in range(2):
            for i in range(3):
                handoff.put(loop, seen.append, round_ * 10 + i)
            threads.append(handoff._thread)
            deadline = time.monotonic() + 5
            while len(seen) < 3 * (round_ + 1) and time.monotonic() < deadline:
                loop.run_until_complete(asyncio.sleep(0.01))
            threads[-1].join(5)
            assert not threads[-1].is_alive() and handoff._thread is None  # ended once idle
    finally:
        loop.close()
    assert threads[0] is not threads[1]  # the next call started another
    assert seen == [0, 1, 2, 10, 11, 12]  # in order, across the restart
