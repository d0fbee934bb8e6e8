"""Hostile requests to the server (engine.serve): each gets a 400 (or 413) in OpenAI's error JSON with a message
that names what is wrong, and the server goes on answering. Bodies are made here: deep nesting, huge numbers,
NaN, wrong types, oversized bodies, fields that would reach files or other addresses."""

from __future__ import annotations

import json

import httpx
import pytest

from serve_helpers import served_default_model

pytestmark = [pytest.mark.model, pytest.mark.slow]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def url():
    with served_default_model() as (_, server, _sink):
        yield server.url


def chat(**fields) -> bytes:
    return json.dumps({"messages": HI, "max_tokens": 2, **fields}).encode()


def completion(**fields) -> bytes:
    return json.dumps({"prompt": "hi", "max_tokens": 2, **fields}).encode()


CASES = [
    # (id, path, raw body, status, words in the message)
    ("deep nesting", "/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nests"),
    ("huge integer", "/chat/completions", b'{"messages": [], "max_tokens": 1' + b"0" * 5000 + b"}", 400, "not JSON"),
    ("infinity", "/chat/completions", chat()[:-1] + b', "temperature": 1e999}', 400, "finite"),
    ("NaN", "/chat/completions", chat()[:-1] + b', "temperature": NaN}', 400, "not a number JSON allows"),
    ("not JSON", "/chat/completions", b"{'messages': 1}", 400, "not JSON"),
    ("not an object", "/completions", b"[1, 2, 3]", 400, "must be a JSON object"),
    ("not UTF-8", "/completions", b'{"prompt": "\xff\xfe"}', 400, "not UTF-8"),
    ("empty", "/completions", b"", 400, "no body"),
    ("max_tokens a string", "/chat/completions", chat(max_tokens="12"), 400, "max_tokens must be a whole number"),
    ("max_tokens zero", "/chat/completions", chat(max_tokens=0), 400, "max_tokens must be from 1"),
    ("n a boolean", "/chat/completions", chat(n=True), 400, "n must be a whole number"),
    ("n 17", "/completions", completion(n=17), 400, "n must be from 1 to 16"),
    ("model a number", "/chat/completions", chat(model=5), 400, "model must be a string"),
    ("messages a string", "/chat/completions", json.dumps({"messages": "hi"}).encode(), 400, "non-empty list"),
    ("tool role", "/chat/completions", chat(messages=[{"role": "tool", "content": "x"}]), 400, "tool calling"),
    ("image part", "/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]),
     400, "text parts only"),
    # A list of prompts is answered now (issue 46), up to MAX_PROMPTS of them.
    ("prompt batch past the limit", "/completions", completion(prompt=["a"] * 33), 400, "at most 32"),
    ("token id past the vocabulary", "/completions", completion(prompt=[10**12]), 400, "token id"),
    ("negative token id", "/completions", completion(prompt=[-1]), 400, "token id"),
    ("too many stops", "/completions", completion(stop=["x"] * 17), 400, "stop takes at most 16"),
    ("stop not text", "/completions", completion(stop=[1]), 400, "stop must be a string"),
    ("logit_bias a string", "/completions", completion(logit_bias="x"), 400, "logit_bias must be an object"),
    ("temperature negative", "/completions", completion(temperature=-1), 400, "temperature"),
    ("unknown sampler stage", "/completions", completion(samplers=["bogus"]), 400, "bogus"),
    ("bad json schema", "/completions", completion(json_schema={"type": 5}), 400, "json_schema"),
    ("broken grammar", "/completions", completion(grammar="root ::= ("), 400, "grammar"),
    ("grammar a number", "/completions", completion(grammar=5), 400, "grammar must be a string"),
    ("schema from a file", "/completions", completion(json_schema={"$ref": "file:///etc/passwd"}), 400, "json_schema"),
    ("schema from an address", "/completions", completion(json_schema={"$ref": "http://127.0.0.1:9/s.json"}), 400,
     "json_schema"),
    ("response_format type", "/chat/completions", chat(response_format={"type": "xml"}), 400, "'xml' is not known"),
    ("stream_options alone", "/chat/completions", chat(stream_options={"include_usage": True}), 400,
     "only allowed with stream"),
    ("top_logprobs alone", "/chat/completions", chat(top_logprobs=3), 400, "needs logprobs: true"),
    ("logprobs past the limit", "/completions", completion(logprobs=1000), 400, "logprobs must be from 0 to 100"),
    # echo is answered now (prompt log-probs, issue 46); streamed it is not.
    ("echo streamed", "/completions", completion(echo=True, logprobs=1, stream=True), 400, "echo"),
    ("unknown field", "/chat/completions", chat(frequency_penalty_typo=1), 400, "unknown field"),
    ("max_tokens past the context", "/completions", completion(max_tokens=10**6), 400, "past the model's context"),
]


@pytest.mark.parametrize("path, body, status, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_request_is_refused_in_words(url, path, body, status, words):
    response = httpx.post(url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"] and "\n" not in error["message"] and "Traceback" not in error["message"]
    # ... and the server goes on answering.
    ok = httpx.post(url + "/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_oversized_bodies_are_413_declared_or_streamed(url):
    big = b'{"prompt": "' + b"x" * (5 * 2**20) + b'"}'
    declared = httpx.post(url + "/completions", content=big, timeout=60)
    assert declared.status_code == 413 and "at most" in declared.json()["error"]["message"]

    def chunks():  # no Content-Length: the body is counted as it arrives
        for i in range(0, len(big), 2**16):
            yield big[i:i + 2**16]

    streamed = httpx.post(url + "/completions", content=chunks(), timeout=60)
    assert streamed.status_code == 413


def test_wrong_method_and_route_are_openai_errors(url):
    assert httpx.get(url + "/chat/completions").json()["error"]["code"] == "method_not_allowed"
    assert httpx.post(url + "/files", json={}).status_code == 404
