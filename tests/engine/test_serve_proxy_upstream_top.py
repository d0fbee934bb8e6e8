"""Proxy mode asks the upstream only for the log-probs the client asked, unless `--upstream-top-n N` (issue 46
item 5): behind llama.cpp's server the top 20 cost several times the plain answer's time and can change its
greedy text.

The upstream is our own server on the default model on 127.0.0.1, behind a relay on 127.0.0.1
(tests/remote_server.py's FakeServer) that keeps every body it received and passes it on as it is; the clients
talk to the proxy on 127.0.0.1. Without the option the upstream gets the client's body exactly (no `logprobs`
or `top_logprobs` it did not send) and the record (sink and trace file) holds what the client asked: the text
pieces alone when it asked none (`upstream_top_n: null`). With `upstream_top_n=5` (`--upstream-top-n 5`) the
upstream is asked for 5 alternatives (chat's `top_logprobs`, completions' `logprobs`, Responses' `include`),
the record has them, and the client's answer has none of them; 0 asks for the chosen tokens' log-probs alone.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import httpx
import pytest

from cli_checks import one_error_line, refuse_model_load, run_cli
from engine.experiments.trace import read_trace
from engine.serve import ServeOptions, start_server
from engine.serve.trace_sink import TraceDirectorySink
from remote_server import FakeServer, Reply
from serve_helpers import RecordingSink, served_default_model

pytestmark = [pytest.mark.model, pytest.mark.slow]

LOGPROBS = "message.output_text.logprobs"
PROMPT = "The capital of France is"


class Relay:
    """An upstream on 127.0.0.1 that passes each request to `target` as it came and keeps its body."""

    def __init__(self, target: str) -> None:
        self.target = target.removesuffix("/v1")
        self.fake = FakeServer(self._handle)
        self.url = self.fake.url

    def _handle(self, method: str, path: str, body) -> Reply:
        url = self.target + path
        if method == "GET":
            r = httpx.get(url, timeout=60)
            return Reply(r.json(), r.status_code)
        if isinstance(body, dict) and body.get("stream"):
            events = []
            with httpx.stream("POST", url, json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        events.append(json.loads(line[5:]))
            return Reply(events=events)
        r = httpx.post(url, json=body, timeout=60)
        return Reply(r.json(), r.status_code)

    def bodies(self, path: str) -> list[dict]:
        return [copy.deepcopy(b) for m, p, b in self.fake.requests if m == "POST" and p == "/v1" + path]

    def close(self) -> None:
        self.fake.close()


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


@pytest.fixture(scope="module")
def relay(served):
    r = Relay(served[1].url)
    yield r
    r.close()


@pytest.fixture
def proxy_with(relay, tmp_path):
    """A proxy in front of the relay with `upstream_top_n` as given; (url, sink, traces)."""
    servers = []

    def start(top: int | None):
        sink, traces = RecordingSink(), TraceDirectorySink(tmp_path / f"top-{top}")
        servers.append(start_server(upstream=relay.url, sink=[sink, traces],
                                    options=ServeOptions(upstream_top_n=top)))
        relay.fake.requests.clear()
        return servers[-1].url, sink, traces

    yield start
    for s in servers:
        s.stop()


def _model(served) -> str:
    return served[0].info.name


def _header(traces: TraceDirectorySink, exchange_id: str) -> dict:
    (path,) = [p for p in traces.written if exchange_id in p.name]
    (run,) = read_trace(path)
    return run.header["served"]


def _alternatives(event) -> int:
    return sum(1 for p in event.top_model if not p.is_rest)


def _stream_chunks(url: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append(json.loads(line[5:]))
    return chunks


def test_by_default_the_upstream_gets_the_clients_body_and_the_record_holds_text_only(served, relay, proxy_with):
    url, sink, traces = proxy_with(None)
    chat = {"model": _model(served), "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 5, "temperature": 0}
    completion = {"model": _model(served), "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    whole = httpx.post(url + "/chat/completions", json=chat, timeout=120).json()
    chunks = _stream_chunks(url + "/chat/completions", {**chat, "stream": True})
    text = httpx.post(url + "/completions", json=completion, timeout=120).json()

    # The upstream got exactly what the client sent: no log-probs were added.
    assert relay.bodies("/chat/completions") == [chat, {**chat, "stream": True}]
    assert relay.bodies("/completions") == [completion]
    assert whole["choices"][0].get("logprobs") is None and text["choices"][0].get("logprobs") is None
    assert all(c["choices"][0].get("logprobs") is None for c in chunks if c.get("choices"))

    # The record holds the text, each piece's log-prob unknown, and the trace says none were given.
    # (the client's answers carry the upstream's ids; the records are in the order the requests were sent)
    said = [whole["choices"][0]["message"]["content"],
            "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]),
            text["choices"][0]["text"]]
    for ex, answer_text in zip(sink.wait_ends(3), said, strict=True):
        assert ex.choices[0].text == answer_text and answer_text
        assert all(math.isnan(e.logprob) and _alternatives(e) == 0 for e in ex.choices[0].events)
        assert _header(traces, ex.id)["upstream_top_n"] is None


def test_by_default_a_clients_own_log_probs_are_what_is_asked_and_recorded(served, relay, proxy_with):
    url, sink, traces = proxy_with(None)
    chat = {"model": _model(served), "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    answer = httpx.post(url + "/chat/completions", json=chat, timeout=120).json()
    assert relay.bodies("/chat/completions") == [chat]
    content = answer["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 2 for t in content)
    ex = sink.wait_ends(1)[0]
    assert all(not math.isnan(e.logprob) and _alternatives(e) == 2 for e in ex.choices[0].events)
    assert _header(traces, ex.id)["upstream_top_n"] == 2


def test_upstream_top_n_5_asks_for_5_records_them_and_gives_the_client_what_it_asked(served, relay, proxy_with):
    url, sink, traces = proxy_with(5)
    chat = {"model": _model(served), "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 5, "temperature": 0}
    completion = {"model": _model(served), "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    whole = httpx.post(url + "/chat/completions", json=chat, timeout=120).json()
    chunks = _stream_chunks(url + "/chat/completions", {**chat, "stream": True})
    text = httpx.post(url + "/completions", json=completion, timeout=120).json()
    asked_two = httpx.post(url + "/completions", json={**completion, "logprobs": 2}, timeout=120).json()
    asked_eight = httpx.post(url + "/completions", json={**completion, "logprobs": 8}, timeout=120).json()

    assert relay.bodies("/chat/completions") == [{**chat, "logprobs": True, "top_logprobs": 5},
                                                 {**chat, "stream": True, "logprobs": True, "top_logprobs": 5}]
    assert [b["logprobs"] for b in relay.bodies("/completions")] == [5, 5, 8]  # max(5, the client's)
    # The client's answers have none of them (or its own number).
    assert whole["choices"][0].get("logprobs") is None and text["choices"][0].get("logprobs") is None
    assert all(c["choices"][0].get("logprobs") is None for c in chunks if c.get("choices"))
    assert all(len(t) == 2 for t in asked_two["choices"][0]["logprobs"]["top_logprobs"])
    assert all(len(t) == 8 for t in asked_eight["choices"][0]["logprobs"]["top_logprobs"])

    for ex, top in zip(sink.wait_ends(5), (5, 5, 5, 5, 8), strict=True):  # in the order the requests were sent
        events = ex.choices[0].events
        assert events and all(not math.isnan(e.logprob) and _alternatives(e) == top for e in events)
        assert _header(traces, ex.id)["upstream_top_n"] == top


def test_upstream_top_n_5_asks_responses_for_the_output_texts_log_probs(served, relay, proxy_with):
    url, sink, traces = proxy_with(5)
    body = {"model": _model(served), "input": "Name a colour.", "max_output_tokens": 5, "temperature": 0}
    answer = httpx.post(url + "/responses", json=body, timeout=120).json()
    assert relay.bodies("/responses") == [{**body, "include": [LOGPROBS], "top_logprobs": 5}]
    part = answer["output"][0]["content"][0]
    assert "logprobs" not in part or not part["logprobs"]
    assert answer.get("top_logprobs") in (0, None)
    ex = sink.wait_ends(1)[0]
    tokens = [e for e in ex.choices[0].events if not e.special]
    assert tokens and all(_alternatives(e) == 5 for e in tokens)
    assert _header(traces, ex.id)["upstream_top_n"] == 5


def test_upstream_top_n_0_asks_for_the_chosen_tokens_log_probs_alone(served, relay, proxy_with):
    url, sink, traces = proxy_with(0)
    chat = {"model": _model(served), "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 5, "temperature": 0}
    answer = httpx.post(url + "/chat/completions", json=chat, timeout=120).json()
    assert relay.bodies("/chat/completions") == [{**chat, "logprobs": True, "top_logprobs": 0}]
    assert answer["choices"][0].get("logprobs") is None
    ex = sink.wait_ends(1)[0]
    assert ex.choices[0].events and all(not math.isnan(e.logprob) and _alternatives(e) == 0
                                        for e in ex.choices[0].events)
    assert _header(traces, ex.id)["upstream_top_n"] == 0


@pytest.mark.parametrize("argv, words", [
    (["serve", "--upstream-top-n", "5"], "--upstream-top-n says what proxy mode asks of its upstream: give "
                                         "--upstream URL too"),
    (["serve", "--upstream", "http://127.0.0.1:9/v1", "--upstream-top-n", "21"], "--upstream-top-n must be from "
                                                                                  "0 to 20, got 21"),
    (["serve", "--upstream", "http://127.0.0.1:9/v1", "--upstream-top-n", "-1"], "--upstream-top-n must be from "
                                                                                  "0 to 20, got -1"),
])
def test_the_flag_is_refused_in_words_without_upstream_or_out_of_range(argv, words, capsys, monkeypatch):
    refuse_model_load(monkeypatch)
    assert run_cli(argv) == 2
    assert words in one_error_line(capsys)


def test_docs_and_help_name_the_flag_its_default_and_its_cost(capsys):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text(encoding="utf-8")
    assert "`--upstream-top-n N`" in doc and "`ServeOptions.upstream_top_n`" in doc and "llama.cpp's server" in doc
    assert run_cli(["serve", "--help"]) == 0
    helped = " ".join(capsys.readouterr().out.split())
    assert "--upstream-top-n N proxy mode: ask the upstream for N alternatives" in helped
    assert "default: forward the client's request as it is; behind llama.cpp's server" in helped
