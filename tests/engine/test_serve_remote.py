"""Our own remote backend against our server, and proxy mode in front of a real upstream (llama.cpp's server).

- server sampling: the remote backend maps our settings to llama.cpp's fields, our server maps them back
  (one mapping, engine.sampling.llamacpp_json): the same seed gives the same tokens as the local model, and
  the top-N the remote backend shows is the local model's top-N exactly (the log-probs travel as JSON
  floats, which round-trip exactly);
- we sample: the server's top-N for each step; the remote backend shows them as reported, shifted back from
  its renormalisation, so they equal the local model's within 1e-6 (float32 arithmetic in the shift);
- proxy mode: the client gets what the upstream answered (log-probs only when it asked), and the record has
  every token with the upstream's top-N.
"""

from __future__ import annotations

import dataclasses

import httpx
import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")

from engine import GenerationRequest, SamplerSettings  # noqa: E402
from engine.backends.remote import RemoteBackend  # noqa: E402
from engine.backends.remote.generate import remote_events  # noqa: E402
from engine.events import TokenEvent  # noqa: E402
from engine.serve import ServeOptions, start_server  # noqa: E402
from serve_helpers import RecordingSink, served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]
WE_SAMPLE_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


@pytest.fixture(scope="module")
def remote(served):
    backend = RemoteBackend.connect(served[1].url)
    yield backend
    backend.close()


def _tokens(events) -> list[TokenEvent]:
    return [e for e in events if isinstance(e, TokenEvent) and not e.special]


def _top(event: TokenEvent, n: int) -> list[tuple[int, float]]:
    return [(p.token_id, p.logprob) for p in event.top_model if not p.is_rest][:n]


def test_remote_backend_sees_a_llamacpp_server(remote, served):
    server = remote.info.server
    assert server.kind == "llama.cpp" and server.max_top_logprobs == 100
    assert server.tokenize and server.token_prompts and server.seed
    assert remote.info.context_length == served[0].info.context_length


@pytest.mark.parametrize("prompt", [dict(prompt="Once upon a time"),
                                    dict(messages=({"role": "user", "content": "Tell me a joke"},))])
def test_server_sampling_same_seed_same_tokens_and_top_n(remote, served, prompt):
    engine = served[0]
    sampler = SamplerSettings(temperature=0.9, top_k=30, min_p=0.02, seed=11)
    request = GenerationRequest(sampler=sampler, max_new_tokens=12, top_n=5, server_sampling=True, **prompt)
    local = _tokens(engine.generate(dataclasses.replace(request, server_sampling=False)))
    through_server = _tokens(remote_events(remote, request))
    assert [e.token_id for e in through_server] == [e.token_id for e in local]
    assert "".join(e.text for e in through_server) == "".join(e.text for e in local)
    for ours, theirs in zip(local, through_server):
        assert _top(theirs, 5) == _top(ours, 5)  # exactly: the same numbers, through JSON
        assert theirs.logprob == ours.logprob


def test_we_sample_top_n_equals_the_local_models(remote, served):
    engine = served[0]
    request = GenerationRequest(prompt="The capital of France is", sampler=SamplerSettings(temperature=0),
                                max_new_tokens=6, top_n=5)
    local = _tokens(engine.generate(request))
    through_server = _tokens(remote_events(remote, request))
    assert [e.token_id for e in through_server] == [e.token_id for e in local]
    for ours, theirs in zip(local, through_server):
        assert [i for i, _ in _top(theirs, 5)] == [i for i, _ in _top(ours, 5)]
        for (_, a), (_, b) in zip(_top(theirs, 5), _top(ours, 5)):
            assert abs(a - b) < WE_SAMPLE_TOLERANCE


def test_proxy_records_what_the_upstream_answered(llama_server_url):
    sink = RecordingSink()
    # upstream_top_n=20: the record has the upstream's top 20 whatever the client asked (not the default)
    with start_server(upstream=llama_server_url, sink=sink, options=ServeOptions(upstream_top_n=20)) as proxy:
        client = openai.OpenAI(base_url=proxy.url, api_key="x", max_retries=0, timeout=120)
        model = client.models.list().data[0].id  # forwarded: the upstream's list
        direct = httpx.post(llama_server_url + "/completions", timeout=60, json={
            "model": model, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
            "logprobs": 3}).json()["choices"][0]
        # Streamed, without log-probs: the client gets none, the record has the upstream's top-N per token.
        text = "".join(chunk.choices[0].text for chunk in client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True)
            if chunk.choices)
        assert text == direct["text"]
        ex = sink.wait_ends(1)[0]
        assert ex.proxied and ex.upstream == llama_server_url and ex.prompt == "The capital of France is"
        events = ex.choices[0].events
        assert "".join(e.text for e in events) == text and ex.choices[0].finish_reason == "length"
        assert [e.token_text for e in events] == direct["logprobs"]["tokens"]
        assert [e.logprob for e in events] == pytest.approx(direct["logprobs"]["token_logprobs"], abs=1e-5)
        assert all(len([p for p in e.top_model if not p.is_rest]) >= 3 for e in events)
        # Whole, with log-probs: the client gets the number it asked for.
        answer = client.completions.create(model=model, prompt="The capital of France is", max_tokens=6,
                                           temperature=0, logprobs=2)
        assert answer.choices[0].text == text
        assert all(len(top) <= 2 for top in answer.choices[0].logprobs.top_logprobs)
        assert sink.wait_ends(2)[1].choices[0].text == text
        # The upstream's refusal reaches the client with its status.
        bad = {"model": model, "prompt": "x", "max_tokens": "many"}
        upstream_status = httpx.post(llama_server_url + "/completions", json=bad, timeout=60).status_code
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(**bad)  # type: ignore[arg-type]
        assert e.value.status_code == upstream_status >= 400
        assert "the upstream server refused the request" in e.value.message and "\n" not in e.value.message


def test_proxy_stop_request_ends_the_clients_stream(served):
    """Our own server as the upstream: the proxy's Stop ends the client's stream with a last chunk and [DONE]."""
    upstream = served[1]
    sink = RecordingSink()
    # upstream_top_n=20: the recorded tokens' ids come with the log-probs asked of the upstream
    with start_server(upstream=upstream.url, sink=sink, options=ServeOptions(upstream_top_n=20)) as proxy:
        client = openai.OpenAI(base_url=proxy.url, api_key="x", max_retries=0, timeout=120)
        chunks = []
        for chunk in client.chat.completions.create(model=served[0].info.name, messages=[{"role": "user", "content": "Count"}],
                                                    max_tokens=4000, stream=True, extra_body={"ignore_eos": True}):
            chunks.append(chunk)
            if len(chunks) == 4:
                assert proxy.stop_request(sink.wait_starts(1)[0].id)
        assert chunks[-1].choices[0].finish_reason == "stop" and len(chunks) < 1000
        ex = sink.wait_ends(1)[0]
        assert ex.proxied and ex.stopped and ex.choices[0].finish_reason == "stop"
        assert len(ex.choices[0].events) >= 3 and all(e.token_id >= 0 for e in ex.choices[0].events)  # ids given
