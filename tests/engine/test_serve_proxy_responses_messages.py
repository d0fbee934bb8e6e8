"""Proxy mode passes `/v1/responses`, `/v1/messages` and `/v1/messages/count_tokens` to its upstream and records
what comes back; and its completions: a list of prompts, and `echo` (the record holds the answer, not the prompt).

The upstream is our own server on the default model on 127.0.0.1 (it answers all three APIs); the clients are
the official `openai` (`responses.create`) and `anthropic` (`messages.create`, `messages.count_tokens`) clients
against the proxy on 127.0.0.1. Each answer through the proxy is the upstream's own (asked directly, at
temperature 0), whole and streamed; the record (sink and trace file) holds its tokens: with the upstream's
top 20 where the API gives log-probs (Responses), the text pieces alone where it has none (Anthropic's, said
as `upstream_top_n: null`). An upstream without the route (404) is a clear 404 in the API's own error shape.
"""

from __future__ import annotations

import math
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")
anthropic = pytest.importorskip("anthropic", reason="needs the anthropic package (the test extra)")

from engine.experiments.trace import read_trace  # noqa: E402
from engine.serve import ServeOptions, start_server  # noqa: E402
from engine.serve.proxy_limits import ProxyLimits  # noqa: E402
from engine.serve.trace_sink import TraceDirectorySink  # noqa: E402
from hostile_upstream import HostileUpstream  # noqa: E402
from serve_helpers import RecordingSink, served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

LOGPROBS = ["message.output_text.logprobs"]


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


@pytest.fixture(scope="module")
def proxied(served, tmp_path_factory):
    sink, traces = RecordingSink(), TraceDirectorySink(tmp_path_factory.mktemp("proxied"))
    # upstream_top_n=20: the record keeps the upstream's top 20 whatever the client asked (by default it holds
    # what the client asked: tests/engine/test_serve_proxy_upstream_top.py)
    server = start_server(upstream=served[1].url, sink=[sink, traces], options=ServeOptions(upstream_top_n=20))
    try:
        yield server, sink, traces
    finally:
        server.stop()


@pytest.fixture
def proxy(proxied):
    server, sink, traces = proxied
    sink.clear()
    traces.written.clear()
    return proxied


def _model(served) -> str:
    return served[0].info.name


def _oai(url: str):
    return openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)


def _claude(url: str):
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)


def _trace(traces: TraceDirectorySink, exchange_id: str):
    (path,) = [p for p in traces.written if exchange_id in p.name]
    (run,) = read_trace(path)
    return run


def _alternatives(event) -> int:
    return sum(1 for p in event.top_model if not p.is_rest)


# --- Responses -------------------------------------------------------------------------------------------


def test_responses_pass_through_whole_and_streamed_and_are_recorded_with_top_20(served, proxy):
    server, sink, traces = proxy
    kw = dict(model=_model(served), input="Name three colours.", instructions="Answer briefly.",
              max_output_tokens=8, temperature=0)
    direct = _oai(served[1].url).responses.create(**kw, include=LOGPROBS, top_logprobs=3)
    upstream_tokens = [lp.token for lp in direct.output[0].content[0].logprobs]
    client = _oai(server.url)

    whole = client.responses.create(**kw)
    assert whole.output_text == direct.output_text and whole.status == direct.status
    assert whole.output[0].content[0].logprobs is None  # not asked: taken out again
    assert whole.usage.input_tokens == direct.usage.input_tokens and whole.top_logprobs == 0
    events = list(client.responses.create(**kw, stream=True))
    direct_events = list(_oai(served[1].url).responses.create(**kw, stream=True))
    assert [e.type for e in events] == [e.type for e in direct_events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == direct.output_text and all(e.logprobs == [] for e in deltas)
    assert events[-1].response.output_text == direct.output_text

    for ex, answer_id in zip(sink.wait_ends(2), (whole.id, events[-1].response.id)):
        assert ex.proxied and ex.endpoint == "responses" and ex.id.startswith("resp_")
        assert ex.messages == ({"role": "system", "content": "Answer briefly."},
                               {"role": "user", "content": "Name three colours."})
        tokens = [e for e in ex.choices[0].events if not e.special]
        assert [e.token_text for e in tokens] == upstream_tokens
        assert "".join(e.text for e in tokens) == direct.output_text == ex.choices[0].text
        assert all(not math.isnan(e.logprob) and _alternatives(e) == 20 for e in tokens)
        stats = ex.choices[0].stats
        assert stats.prompt_tokens == direct.usage.input_tokens and stats.generated_tokens == len(tokens)
        assert ex.choices[0].finish_reason == ("length" if direct.status == "incomplete" else "stop")
        run = _trace(traces, ex.id)
        assert run.header["served"]["endpoint"] == "responses" and run.header["served"]["upstream_top_n"] == 20
        assert run.end["text"] == direct.output_text and len(run.events()) == len(ex.choices[0].events)


def test_responses_logprobs_asked_through_the_proxy_are_the_clients_number(served, proxy):
    server, sink, _ = proxy
    kw = dict(model=_model(served), max_output_tokens=4, temperature=0, include=LOGPROBS, top_logprobs=2,
              input=[{"role": "user", "content": [{"type": "input_text", "text": "The capital of France is"}]}])
    direct = _oai(served[1].url).responses.create(**kw)
    answer = _oai(server.url).responses.create(**kw)
    part, direct_part = answer.output[0].content[0], direct.output[0].content[0]
    assert part.text == direct_part.text and answer.top_logprobs == 2
    assert [(lp.token, lp.logprob) for lp in part.logprobs] == [(lp.token, lp.logprob) for lp in direct_part.logprobs]
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    ex = sink.wait_ends(1)[0]
    assert ex.messages == ({"role": "user", "content": "The capital of France is"},)  # parts joined, as ours
    tokens = [e for e in ex.choices[0].events if not e.special]
    assert [e.logprob for e in tokens] == pytest.approx([lp.logprob for lp in direct_part.logprobs], abs=1e-6)
    assert all(_alternatives(e) == 20 for e in tokens)  # the record keeps the upstream's top 20


# --- Anthropic Messages ------------------------------------------------------------------------------------


def test_messages_and_count_tokens_pass_through_and_are_recorded_as_text(served, proxy):
    server, sink, traces = proxy
    kw = dict(model=_model(served), max_tokens=8, system=[{"type": "text", "text": "Answer briefly."}],
              messages=[{"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}],
              extra_body={"temperature": 0})  # anthropic 2.x: the sampler fields as extra_body
    upstream, client = _claude(served[1].url), _claude(server.url)
    direct = upstream.messages.create(**kw)
    whole = client.messages.create(**kw)
    assert whole.content[0].text == direct.content[0].text and whole.stop_reason == direct.stop_reason
    assert whole.usage.output_tokens == direct.usage.output_tokens
    with client.messages.stream(**kw) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == direct.content[0].text == final.content[0].text
    assert final.stop_reason == direct.stop_reason
    raw = list(client.messages.create(**kw, stream=True))
    assert [e.type for e in raw] == [e.type for e in upstream.messages.create(**kw, stream=True)]
    counted = client.messages.count_tokens(model=kw["model"], system=kw["system"], messages=kw["messages"])
    assert counted.input_tokens == upstream.messages.count_tokens(
        model=kw["model"], system=kw["system"], messages=kw["messages"]).input_tokens > 5

    ends = sink.wait_ends(3)
    streamed_pieces = [e.text for e in ends[1].choices[0].events]
    assert streamed_pieces == pieces  # one recorded token per text_delta the upstream sent
    prompt = direct.usage.input_tokens + direct.usage.cache_read_input_tokens
    for ex in ends:
        assert ex.proxied and ex.endpoint == "messages" and ex.choices[0].text == direct.content[0].text
        assert ex.messages == ({"role": "system", "content": "Answer briefly."},
                               {"role": "user", "content": "Name three colours."})
        assert ex.choices[0].events and all(math.isnan(e.logprob) and not e.top_model for e in ex.choices[0].events)
        assert ex.choices[0].stats.prompt_tokens == prompt == counted.input_tokens
        assert ex.choices[0].finish_reason == ("length" if direct.stop_reason == "max_tokens" else "stop")
        run = _trace(traces, ex.id)
        assert run.header["served"]["endpoint"] == "messages" and run.header["served"]["upstream_top_n"] is None
        assert run.end["text"] == direct.content[0].text


def test_stop_ends_a_proxied_messages_stream_and_responses_stream(served, proxy):
    server, sink, _ = proxy
    body = {"model": _model(served), "messages": [{"role": "user", "content": "Count"}], "max_tokens": 4000,
            "extra_body": {"ignore_eos": True}}
    with _claude(server.url).messages.stream(**body) as stream:
        for k, _ in enumerate(stream.text_stream):
            if k == 3:
                assert server.stop_request(sink.wait_starts(1)[0].id)
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.usage.output_tokens < 1000
    events = []
    for event in _oai(server.url).responses.create(model=_model(served), input="Count", max_output_tokens=4000,
                                                   stream=True, extra_body={"ignore_eos": True}):
        events.append(event)
        if len(events) == 8:
            assert server.stop_request(sink.wait_starts(2)[1].id)
    assert events[-1].type == "response.incomplete" and len(events) < 1000
    assert events[-1].response.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    for ex in sink.wait_ends(2):
        assert ex.stopped and ex.choices[0].finish_reason == "stop" and 3 <= len(ex.choices[0].events) < 1000


def test_an_upstream_without_these_apis_is_a_clear_404_in_each_apis_shape(served):
    """An upstream that answers 404 for the routes (ours, under a path that has none of them)."""
    with start_server(upstream=served[1].url + "/nowhere") as proxy:
        with pytest.raises(openai.NotFoundError) as e:
            _oai(proxy.url).responses.create(model=_model(served), input="Hi")
        assert "does not seem to have OpenAI's Responses API" in e.value.message
        assert e.value.body["code"] == "upstream_lacks_endpoint"
        with pytest.raises(anthropic.NotFoundError) as e2:
            _claude(proxy.url).messages.create(model=_model(served), max_tokens=2,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert "does not seem to have Anthropic's Messages API" in e2.value.message
        for path in ("/messages", "/messages/count_tokens"):
            r = httpx.post(proxy.url + path, timeout=30, json={
                "model": "m", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "Hi"}]})
            assert r.status_code == 404 and r.json()["type"] == "error"
            assert r.json()["error"]["type"] == "not_found_error"
            assert "does not seem to have Anthropic's Messages API" in r.json()["error"]["message"]
        r = httpx.post(proxy.url + "/responses", json={"input": "Hi", "stream": True}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "upstream_lacks_endpoint"


# --- completions: several prompts, echo ------------------------------------------------------------------


def test_a_list_of_prompts_passes_through_and_each_answer_is_recorded(served, proxy):
    """Before: 502 bad_upstream ("answered with choice index 1; the request asked for 1 choice")."""
    server, sink, _ = proxy
    body = {"model": _model(served), "prompt": ["The cat", "A dog"], "max_tokens": 3, "temperature": 0, "n": 1}
    direct = httpx.post(served[1].url + "/completions", json=body, timeout=60).json()
    r = httpx.post(server.url + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == [c["text"] for c in direct["choices"]]
    # One record per prompt, as the engine's own server keeps them (`<id>-<p>`, its prompt, its n choices).
    ends = sorted(sink.wait_ends(2), key=lambda ex: ex.id)
    assert [ex.prompt for ex in ends] == ["The cat", "A dog"] and ends[0].id.endswith("-0")
    assert [ex.choices[0].text for ex in ends] == [c["text"] for c in direct["choices"]]
    assert all(len(ex.choices) == 1 and len(ex.choices[0].events) == 3 for ex in ends)


def test_echo_records_the_answer_not_the_echoed_prompt(served, proxy):
    """Before: "The cat sat" + 2 tokens was recorded as 5 generated tokens, the first with no log-prob."""
    server, sink, traces = proxy
    body = {"model": _model(served), "prompt": "The cat sat", "echo": True, "logprobs": 1, "max_tokens": 2,
            "temperature": 0}
    direct = httpx.post(served[1].url + "/completions", json={**body, "echo": False}, timeout=60).json()
    answer_text = direct["choices"][0]["text"]
    began = time.perf_counter()
    r = httpx.post(server.url + "/completions", json=body, timeout=60)
    took = time.perf_counter() - began
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "The cat sat" + answer_text  # the client gets the echo, unchanged
    assert choice["logprobs"]["token_logprobs"][0] is None
    ex = sink.wait_ends(1)[0]
    events = ex.choices[0].events
    assert len(events) == 2 and all(not math.isnan(e.logprob) for e in events)
    assert [e.token_text for e in events] == direct["choices"][0]["logprobs"]["tokens"]
    assert ex.choices[0].text == answer_text and ex.prompt == "The cat sat"
    stats = ex.choices[0].stats
    assert stats.generated_tokens == 2 and stats.prompt_tokens == r.json()["usage"]["prompt_tokens"]
    # Timed from the request, not from the whole answer's headers (which come when it is finished).
    assert took >= stats.total_s >= 0.5 * took and stats.time_to_first_token_s >= 0.5 * took
    assert _trace(traces, ex.id).end["text"] == answer_text

    # Score only (max_tokens 0) over two prompts: nothing generated, each choice its own prompt's tokens.
    sink.clear()
    r = httpx.post(server.url + "/completions", timeout=60, json={**body, "max_tokens": 0,
                                                                  "prompt": ["The cat sat", "A dog ran far away"]})
    assert r.status_code == 200, r.text
    lengths = [len(c["logprobs"]["tokens"]) for c in r.json()["choices"]]
    ends = sorted(sink.wait_ends(2), key=lambda ex: ex.id)
    assert [len(ex.choices[0].events) for ex in ends] == [0, 0] and [ex.choices[0].text for ex in ends] == ["", ""]
    assert [ex.choices[0].stats.prompt_tokens for ex in ends] == lengths and lengths[0] < lengths[1]


# --- the proxy's limits on the new routes (tests/hostile_upstream.py: real HTTP on 127.0.0.1) ----------------

LIMITS = ProxyLimits(max_answer_bytes=128 * 1024, max_answer_tokens=40, max_line_bytes=32 * 1024,
                     max_connections=3, pool_wait_s=0.5, disconnect_poll_s=0.05)
MESSAGE = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def hostile():
    with HostileUpstream(drip_s=0.1) as up:
        sink = RecordingSink()
        server = start_server(upstream=up.url, sink=sink, options=ServeOptions(proxy=LIMITS))
        try:
            yield up, server, sink
        finally:
            server.stop()


def _give_up(url: str, body: dict, after_s: float) -> None:
    try:
        httpx.post(url, json=body, timeout=after_s)
    except httpx.TimeoutException:
        pass  # the client gave up: httpx closes its connection


def test_new_routes_keep_the_proxys_byte_cap_pool_wait_and_hang_up(hostile):
    up, server, sink = hostile
    # Past the byte cap: 502 bad_upstream in each API's shape (a stream: its error event, after what came).
    r = httpx.post(server.url + "/messages", json={**MESSAGE, "model": "endless"}, timeout=30)
    assert r.status_code == 502 and r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert "more than 131,072 bytes" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/responses", json={"model": "endless", "input": "hi"}, timeout=30)
    assert r.status_code == 502 and r.json()["error"]["code"] == "bad_upstream"
    with httpx.stream("POST", server.url + "/responses", json={"model": "endless", "input": "hi", "stream": True},
                      timeout=30) as s:
        lines = [line for line in s.iter_lines() if line.startswith(("event:", "data:"))]
    assert lines[-2] == "event: error" and "bad_upstream" in lines[-1] and "[DONE]" not in lines[-1]
    assert all(ex.error for ex in sink.wait_ends(3))
    # Every connection taken by clients waiting on an upstream that never answers: the next gets 503 in
    # Anthropic's shape after the pool wait; the waiting clients give up and their upstream calls close.
    waiting = [threading.Thread(target=_give_up, args=(server.url + "/messages", {**MESSAGE, "model": "hang"}, 2.0))
               for _ in range(LIMITS.max_connections)]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 5
    while up.busy < LIMITS.max_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    r = httpx.post(server.url + "/messages", json={**MESSAGE, "model": "ok"}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
    assert "upstream" in r.json()["error"]["message"]
    for t in waiting:
        t.join(10)
    assert up.wait_idle(2), f"{up.busy} upstream calls still open after their clients left"
    r = httpx.post(server.url + "/messages/count_tokens", json={**MESSAGE, "model": "ok"}, timeout=10)
    assert r.status_code == 200  # the pool is free again (the hostile upstream answers any route alike)
    # A client that leaves a dripping stream after two events closes its upstream stream; the record says so.
    sink.clear()
    with httpx.stream("POST", server.url + "/responses", json={"model": "drip", "input": "hi", "stream": True},
                      timeout=10) as s:
        got = [line for line, _ in zip((x for x in s.iter_lines() if x.startswith("data:")), range(2))]
    assert len(got) == 2
    assert up.wait_idle(2), "the upstream stream stayed open after its client left"
    assert sink.wait_ends(1)[0].disconnected
