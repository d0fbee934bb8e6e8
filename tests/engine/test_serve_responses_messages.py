"""`/v1/responses` (the official `openai` client's `responses.create`) and `/v1/messages` (the official
`anthropic` client) on the default model, on 127.0.0.1: whole and streamed answers agree, their event sequences,
log-probs, previous_response_id, stop reasons, usage and count_tokens, refusals and bad bodies in each API's own
error shape, the API key as x-api-key, a client that leaves mid-stream, and the record (sink and trace) of both.
"""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")
anthropic = pytest.importorskip("anthropic", reason="needs the anthropic package (the test extra)")

from engine.experiments.trace import read_trace  # noqa: E402
from engine.serve.trace_sink import TraceDirectorySink  # noqa: E402
from serve_helpers import served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

RESPONSES_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"]
RESPONSES_END = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


@pytest.fixture
def engine(served):
    return served[0]


@pytest.fixture
def server(served):
    return served[1]


@pytest.fixture
def sink(served):
    served[2].clear()
    return served[2]


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0, timeout=120)


@pytest.fixture
def claude(server):
    return anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="not-needed", max_retries=0,
                               timeout=120)


# --- Responses ---------------------------------------------------------------------------------------------


def test_responses_whole_and_streamed_agree_and_are_recorded(oai, engine, sink, tmp_path):
    kw = dict(model=engine.info.name, input="Name three colours.", instructions="Answer briefly.",
              max_output_tokens=10, temperature=0.8, extra_body={"seed": 5, "top_k": 30})
    whole = oai.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.output_text
    assert whole.status in ("completed", "incomplete") and whole.output[0].role == "assistant"
    assert whole.usage.output_tokens >= 1 and whole.usage.input_tokens > 5 and whole.instructions == "Answer briefly."
    events = list(oai.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == RESPONSES_EVENTS and kinds[-4:-1] == RESPONSES_END
    assert kinds[-1] == ("response.completed" if whole.status == "completed" else "response.incomplete")
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    first, second = sink.wait_ends(2)
    for ex, answer in ((first, whole), (second, final)):
        assert ex.endpoint == "responses" and ex.id == answer.id and ex.choices[0].text == whole.output_text
        assert ex.messages == ({"role": "system", "content": "Answer briefly."},
                               {"role": "user", "content": "Name three colours."})
        assert ex.seed == 5 and ex.sampler.temperature == 0.8 and ex.sampler.top_k == 30
        assert all(len(e.top_model) == 20 and e.stages for e in ex.choices[0].events)
    if whole.status == "incomplete":
        assert whole.incomplete_details.reason == "max_output_tokens" and len(first.choices[0].events) == 10
    TraceDirectorySink(tmp_path, engine.info).on_end(first)  # what --record-dir writes
    (run,) = read_trace(next(tmp_path.glob("*.jsonl")))
    assert run.header["served"]["endpoint"] == "responses" and run.end["text"] == whole.output_text


def test_responses_logprobs_in_the_output_text(oai, engine, sink):
    answer = oai.responses.create(model=engine.info.name, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "The capital of France is"}]}], max_output_tokens=5, temperature=0,
        include=["message.output_text.logprobs"], top_logprobs=3)
    part = answer.output[0].content[0]
    events = [e for e in sink.wait_ends(1)[0].choices[0].events if not e.special]
    assert len(part.logprobs) == len(events) >= 1 and "".join(lp.token for lp in part.logprobs) == part.text
    for lp, event in zip(part.logprobs, events):
        assert lp.logprob == event.logprob and lp.bytes == list(event.token_text.encode())
        assert [(t.token, t.logprob) for t in lp.top_logprobs] == [(p.text, p.logprob) for p in event.top_model[:3]]
    streamed = list(oai.responses.create(model=engine.info.name, input="The capital of France is",
                                         max_output_tokens=5, temperature=0, stream=True,
                                         include=["message.output_text.logprobs"], top_logprobs=3))
    deltas = [lp for e in streamed if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [(d.token, d.logprob) for d in deltas] == [(lp.token, lp.logprob) for lp in part.logprobs]


def test_responses_previous_response_id_continues_a_stored_response(oai, engine, sink):
    first = oai.responses.create(model=engine.info.name, input="My name is Ada.", instructions="Be brief.",
                                 max_output_tokens=8, temperature=0)
    second = oai.responses.create(model=engine.info.name, input="What is my name?", previous_response_id=first.id,
                                  max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    ex = sink.wait_ends(2)[1]
    # The earlier turn and its answer come first; its instructions are not carried over (as OpenAI's API does).
    assert ex.messages == ({"role": "user", "content": "My name is Ada."},
                           {"role": "assistant", "content": first.output_text},
                           {"role": "user", "content": "What is my name?"})
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model=engine.info.name, input="Hi", previous_response_id="resp_nonesuch")
    assert e.value.status_code == 404 and "resp_nonesuch" in e.value.body["message"]
    unstored = oai.responses.create(model=engine.info.name, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=engine.info.name, input="Hi", previous_response_id=unstored.id)


@pytest.mark.parametrize("extra, param, words", [
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
    ({"background": True}, "background", "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
    ({"include": ["file_search_call.results"]}, "include", "not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]", "text parts only"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "input[0].tool_call_id",
     "no assistant message"),  # an output for a call never made
    ({"frobnicate": 1}, "frobnicate", "unknown field"),
    ({"max_output_tokens": "many"}, "max_output_tokens", "whole number"),
    ({"max_output_tokens": 10**6}, "max_output_tokens", "context"),
    ({"temperature": "hot"}, None, "temperature"),
    ({"input": []}, "input", "non-empty"),
    ({"input": [None] * 20_000}, "input", "at most"),
    ({"text": {"format": {"type": "json_schema"}}}, "text.format", "schema"),
    ({"model": "gpt-4o"}, "model", "does not exist"),
])
def test_responses_refusals_are_400s_in_words(oai, engine, sink, extra, param, words):
    status = 404 if param == "model" else 400
    with pytest.raises(openai.APIStatusError) as e:
        oai.responses.create(model=engine.info.name, input="Hi", extra_body=extra)
    assert e.value.status_code == status and words in e.value.body["message"]
    if param is not None:
        assert e.value.body["param"] == param
    assert not sink.started  # nothing ran


def test_responses_malformed_bodies_are_openai_shaped_400s(server):
    for raw in (b"{", b"[1]", b'{"input": "x", "stream": "yes"}', b'{"input": {"role": "user"}}'):
        r = httpx.post(server.url + "/responses", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


# --- Anthropic Messages ------------------------------------------------------------------------------------


def test_messages_whole_streamed_and_count_tokens(claude, engine, sink, tmp_path):
    kw = dict(model=engine.info.name, system=[{"type": "text", "text": "Answer briefly."}],
              messages=[{"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}],
              max_tokens=10)
    # The sampler fields go as extra_body: anthropic 2.x no longer has them as arguments (Claude's newest models
    # refuse them); older clients and other harnesses send them.
    sampling = {"seed": 3, "temperature": 0.7, "top_k": 40, "top_p": 0.9}
    whole = claude.messages.create(**kw, extra_body=sampling)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    text = whole.content[0].text
    assert text and whole.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(**kw, extra_body=sampling) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text == final.content[0].text and final.stop_reason == whole.stop_reason
    counted = claude.messages.count_tokens(model=engine.info.name, system=kw["system"], messages=kw["messages"])
    first, second = sink.wait_ends(2)
    for ex, answer in ((first, whole), (second, final)):
        assert ex.endpoint == "messages" and ex.id == answer.id and ex.choices[0].text == text and ex.seed == 3
        assert ex.messages == ({"role": "system", "content": "Answer briefly."},
                               {"role": "user", "content": "Name three colours."})
        assert ex.sampler.top_k == 40 and ex.sampler.top_p == 0.9 and ex.sampler.temperature == 0.7
        usage = answer.usage
        assert usage.output_tokens == len(ex.choices[0].events)
        assert usage.input_tokens + usage.cache_read_input_tokens == len(ex.prompt_ids) == counted.input_tokens
        assert usage.cache_read_input_tokens == ex.choices[0].stats.reused_tokens
    if whole.stop_reason == "max_tokens":
        assert len(first.choices[0].events) == 10
    TraceDirectorySink(tmp_path, engine.info).on_end(second)
    (run,) = read_trace(next(tmp_path.glob("*.jsonl")))
    assert run.header["served"]["endpoint"] == "messages" and run.end["text"] == text


def test_messages_stream_event_sequence(server, engine):
    body = {"model": engine.info.name, "max_tokens": 6, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Count: 1, 2, 3,"}]}
    with httpx.stream("POST", server.url + "/messages", json=body, timeout=60) as r:
        events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event:")]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[3:-3]) == {"content_block_delta"}


def test_messages_stop_reasons(claude, engine):
    ask = dict(model=engine.info.name, messages=[{"role": "user", "content": "Count from 1 to 20."}],
               extra_body={"temperature": 0})
    long = claude.messages.create(**ask, max_tokens=24)
    assert long.stop_reason == "max_tokens" and long.stop_sequence is None
    text = long.content[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = claude.messages.create(**ask, max_tokens=24, stop_sequences=["never", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]


@pytest.mark.parametrize("extra, words", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, "image blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "1"}]}]},
     "no assistant message"),  # a result for a call never made
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"output_config": {"effort": "high"}}, "output_config"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]}, "prefill"),
    ({"messages": [{"role": "system", "content": "Hi"}]}, "roles are user and assistant"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 10**6}, "context"),
    ({"stop_sequences": ["x"] * 100}, "stop_sequences takes at most"),
    ({"top_k": "many"}, "top_k"),
    ({"model": "claude-sonnet-4-5"}, "does not exist"),
])
def test_messages_refusals_in_anthropic_shape(claude, engine, sink, extra, words):
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(model=engine.info.name, max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
                               extra_body=extra)
    status = 404 if "model" in extra else 400
    assert e.value.status_code == status
    assert e.value.body["type"] == "error" and words in e.value.body["error"]["message"]
    assert e.value.body["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert not sink.started


def test_messages_malformed_bodies_are_anthropic_shaped(server, engine):
    url = server.url + "/messages"
    cases = [b"{", b"[]", b'{"messages": [{"role": "user", "content": "Hi"}]}',  # no max_tokens
             json.dumps({"max_tokens": 5, "messages": "Hi"}).encode(),
             json.dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "frob": 1}).encode(),
             json.dumps({"max_tokens": 5, "messages": [{"role": "user", "content": 7}]}).encode(),
             json.dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}] * 20_000}).encode()]
    for raw in cases:
        r = httpx.post(url, content=raw, headers={"content-type": "application/json"})
        doc = r.json()
        assert r.status_code == 400 and doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert doc["error"]["message"]
    r = httpx.post(url + "/count_tokens", json={"messages": [{"role": "user", "content": [{"type": "audio"}]}]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    big = httpx.post(url, content=b"{" + b" " * (5 * 2**20) + b"}", headers={"content-type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"


def test_messages_api_key_as_x_api_key(engine):
    from engine.serve import start_server

    with start_server(engine, api_key="sesame") as keyed:
        base = keyed.url.removesuffix("/v1")
        ok = anthropic.Anthropic(base_url=base, api_key="sesame", max_retries=0).messages.count_tokens(
            model=engine.info.name, messages=[{"role": "user", "content": "Hi"}])
        assert ok.input_tokens > 1
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
                model=engine.info.name, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
        assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=keyed.url, api_key="wrong", max_retries=0).responses.create(input="Hi")


# --- both --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, body", [
    ("/responses", {"input": "Count: 1, 2, 3,", "max_output_tokens": 4000}),
    ("/messages", {"messages": [{"role": "user", "content": "Count: 1, 2, 3,"}], "max_tokens": 4000}),
])
def test_a_client_that_leaves_mid_stream_frees_the_model(server, engine, sink, path, body):
    with httpx.stream("POST", server.url + path, timeout=60,
                      json={**body, "stream": True, "ignore_eos": True}) as response:
        got = [line for line, _ in zip(response.iter_lines(), range(24)) if line.startswith("data:")]
    assert len(got) >= 6  # a few tokens came, then the client closed the connection
    ex = sink.wait_ends(1, timeout=30)[0]
    assert ex.disconnected and ex.choices[0].finish_reason == "cancelled" and len(ex.choices[0].events) < 1000
    # The model is free again: the next answer is not behind 4000 tokens.
    r = httpx.post(server.url + path, json={**body, ("max_tokens" if path == "/messages" else "max_output_tokens"): 2},
                   timeout=20)
    assert r.status_code == 200


def test_proxy_mode_passes_these_endpoints_to_the_upstream(server, engine):
    """Once a 400 ("not in proxy mode"); the proxy's answers and records: test_serve_proxy_responses_messages.py."""
    from engine.serve import start_server

    said = {"/responses": lambda d: d["output"][0]["content"][0]["text"],
            "/messages": lambda d: d["content"][0]["text"], "/messages/count_tokens": lambda d: d["input_tokens"]}
    turn = [{"role": "user", "content": "Hi"}]
    bodies = {"/responses": {"model": engine.info.name, "input": "Hi", "max_output_tokens": 3, "temperature": 0},
              "/messages": {"model": engine.info.name, "max_tokens": 3, "temperature": 0, "messages": turn},
              "/messages/count_tokens": {"model": engine.info.name, "messages": turn}}
    with start_server(upstream=server.url) as proxy:
        for path, body in bodies.items():
            through, direct = (httpx.post(url + path, json=body, timeout=60) for url in (proxy.url, server.url))
            assert through.status_code == direct.status_code == 200, through.text
            assert said[path](through.json()) == said[path](direct.json())


# Values of every JSON type and some hostile sizes, put in each field a body has (and in a message's or an
# item's place): each answer is a 200 or a 4xx in the API's own shape, never a 500. The answer's length is past
# the context, so that a body all of whose checks pass ends in the last one (the context's) without a model turn
# (the chat path's own sweep runs the sampler fields through the model: test_serve_hostile_fields.py).
_VALUES = [None, True, -1, 1.5, "x", [None] * 3000, {"type": 1}, [{"type": "text", "text": "Hi"}]]


def _sweep(server, path: str, base: dict, fields: list[str], places: list[tuple[str, ...]]) -> list[str]:
    bad = []
    url = server.url + path
    for name in fields + ["/".join(p) for p in places]:
        for value in _VALUES:
            body = json.loads(json.dumps(base))
            if "/" in name or name in [p[0] for p in places if len(p) == 1]:
                *parents, last = name.split("/")
                target = body
                for key in parents:
                    target = target[int(key)] if isinstance(target, list) else target[key]
                target[int(last) if isinstance(target, list) else last] = value
            else:
                body[name] = value
            r = httpx.post(url, json=body, timeout=60)
            doc = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            error = doc.get("error") if isinstance(doc, dict) else None
            shaped = r.status_code == 200 or (isinstance(error, dict) and isinstance(error.get("message"), str)
                                              and (doc.get("type") == "error") == (path == "/messages"))
            if not (r.status_code == 200 or 400 <= r.status_code < 500) or not shaped or \
                    r.status_code == 404 and name not in ("model", "previous_response_id"):  # else: no such route
                bad.append(f"{name}={json.dumps(value)[:40]}: {r.status_code} {r.text[:120]}")
    return bad


def test_every_field_of_a_responses_body_takes_any_value_without_a_500(server):
    from engine.serve.responses_api import RESPONSES_KEYS

    base = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            "max_output_tokens": 10**6}
    # Not the answer's length (left out, it is the context's room: a long answer; the refusal tests check it).
    fields = sorted(RESPONSES_KEYS - {"stream", "max_output_tokens"}) + ["top_k", "seed", "min_p", "logit_bias"]
    places = [("input", "0"), ("input", "0", "role"), ("input", "0", "content", "0")]
    assert _sweep(server, "/responses", base, fields, places) == []


def test_every_field_of_a_messages_body_takes_any_value_without_a_500(server):
    from engine.serve.anthropic_api import MESSAGES_KEYS

    base = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 10**6}
    fields = sorted(MESSAGES_KEYS - {"stream", "max_tokens"}) + ["seed", "min_p"]
    places = [("messages", "0"), ("messages", "0", "role"), ("messages", "0", "content", "0")]
    assert _sweep(server, "/messages", base, fields, places) == []
