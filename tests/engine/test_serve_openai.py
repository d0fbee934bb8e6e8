"""The server (engine.serve) against the official `openai` client, on the default model, on 127.0.0.1.

Streaming and whole answers, `n`, log-probs in OpenAI's exact shapes, json_schema and grammar through our
constraint, llama.cpp's sampler fields, errors as the client's exceptions with their status codes, eight
streams at once, a client that goes away, the window's Stop, and the sink that sees every exchange live.
"""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")

from engine.experiments.trace import read_trace  # noqa: E402
from engine.serve.trace_sink import TraceDirectorySink  # noqa: E402
from serve_helpers import served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]
CHAT = [{"role": "user", "content": "Name three colours."}]


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
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0, timeout=120)


def test_chat_whole_and_streamed_agree_with_the_engine(client, engine, sink, server):
    kw = dict(model=engine.info.name, messages=CHAT, max_tokens=12, seed=5, temperature=0.8)
    whole = client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens >= 1 and whole.usage.prompt_tokens > 5
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    first, second = sink.wait_ends(2)
    # The usage's cached tokens are what each answer reused: the second found the same prompt in the model's
    # cache (all of it but the last token, which runs to give the first token's logits).
    assert whole.usage.prompt_tokens_details.cached_tokens == first.choices[0].stats.reused_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == second.choices[0].stats.reused_tokens
    assert second.choices[0].stats.reused_tokens == whole.usage.prompt_tokens - 1
    # The record: the same answer, every token with its top-N and the sampler's stages, seed 5 as asked.
    for ex in (first, second):
        assert ex.choices[0].text == text and ex.seed == 5 and not ex.proxied and ex.client.startswith("127.0.0.1:")
        assert ex.messages == tuple(CHAT) and ex.sampler.temperature == 0.8
        events = ex.choices[0].events
        assert "".join(e.text for e in events) == text
        assert all(len(e.top_model) == 20 and e.stages for e in events)
        assert [ev for _, ev in sink.tokens[ex.id]] == list(events)  # every token was told live, in order
        assert sink.calls.index(("start", ex.id)) < sink.calls.index(("token", ex.id)) < sink.calls.index(("end", ex.id))
    assert sink.threads == {f"logitlab-serve-{server.port}"}  # sink calls come from the server's thread
    # What the engine gives for the recorded request directly: the same text (the settings were honoured).
    assert engine.complete(first.request).text == text


def test_chat_logprobs_in_openai_shape(client, engine, sink):
    answer = client.chat.completions.create(model=engine.info.name, messages=CHAT, max_tokens=6, seed=1,
                                            logprobs=True, top_logprobs=5)
    content = answer.choices[0].logprobs.content
    events = [e for e in sink.wait_ends(1)[0].choices[0].events if not e.special]
    assert len(content) == len(events) >= 1
    for entry, event in zip(content, events):
        assert entry.token == event.token_text and entry.logprob == event.logprob
        assert entry.bytes == list(event.token_text.encode("utf-8"))
        assert len(entry.top_logprobs) == 5
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert [(t.token, t.logprob) for t in entry.top_logprobs] == [(p.text, p.logprob) for p in event.top_model[:5]]
    assert "".join(e.token for e in content) == answer.choices[0].message.content


def test_completions_logprobs_in_openai_shape(client, engine):
    answer = client.completions.create(model=engine.info.name, prompt="The capital of France is", max_tokens=5,
                                       logprobs=3, temperature=0)
    choice = answer.choices[0]
    lp = choice.logprobs
    assert answer.object == "text_completion" and choice.text.startswith(" Paris")
    assert "".join(lp.tokens) == choice.text and len(lp.token_logprobs) == len(lp.tokens)
    assert all(isinstance(t, dict) and 1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert lp.top_logprobs[0][" Paris"] == lp.token_logprobs[0] < 0  # greedy: the chosen token is the top one
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_n_choices_whole_and_streamed(client, engine, sink):
    whole = client.completions.create(model=engine.info.name, prompt="My favourite animal is the", max_tokens=6,
                                      n=3, seed=7, temperature=1.0)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = {c.text for c in whole.choices}
    assert len(texts) >= 2  # three draws with seeds 7, 8, 9
    ex = sink.wait_ends(1)[0]
    assert [c.text for c in ex.choices] == [c.text for c in whole.choices]
    assert [c.stats.seed for c in ex.choices] == [7, 8, 9]
    stream = client.chat.completions.create(model=engine.info.name, messages=CHAT, max_tokens=5, n=2, seed=3,
                                            stream=True)
    per_choice: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            per_choice[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    assert [c.text for c in sink.wait_ends(2)[1].choices] == [per_choice[0], per_choice[1]]


def test_json_schema_and_grammar_constrain_the_answer(client, engine):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    answer = client.chat.completions.create(
        model=engine.info.name, messages=[{"role": "user", "content": "Your favourite colour, as JSON?"}],
        max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)
    yes_no = client.completions.create(model=engine.info.name, prompt="Is the sky blue? Answer:", max_tokens=4,
                                       extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert yes_no.choices[0].text in (" yes", " no")


def test_llamacpp_sampler_fields_are_honoured(client, engine, sink):
    greedy = client.completions.create(model=engine.info.name, prompt="Once upon a time", max_tokens=8, temperature=0)
    top1 = client.completions.create(model=engine.info.name, prompt="Once upon a time", max_tokens=8, temperature=1.5,
                                     seed=3, extra_body={"top_k": 1, "samplers": ["top_k", "temperature"]})
    assert top1.choices[0].text == greedy.choices[0].text
    assert sink.wait_ends(2)[1].sampler.top_k == 1
    # post_sampling_probs: the alternatives are the sampler's: top_k 2 leaves two, summing to 1.
    post = client.completions.create(model=engine.info.name, prompt="Once upon a time", max_tokens=3, logprobs=5,
                                     extra_body={"top_k": 2, "post_sampling_probs": True})
    for alternatives in post.choices[0].logprobs.top_logprobs:
        assert len(alternatives) == 2 and math.isclose(sum(math.exp(v) for v in alternatives.values()), 1, rel_tol=1e-6)


def test_errors_are_openai_exceptions_with_their_status(client, engine, server):
    name = engine.info.name
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    with pytest.raises(openai.BadRequestError, match="must describe an object") as e:  # tools: test_serve_tools.py
        client.chat.completions.create(model=name, messages=CHAT,
                                       tools=[{"type": "function", "function": {"name": "f",
                                                                                "parameters": {"type": "array"}}}])
    assert e.value.status_code == 400 and e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError, match="n must be from 1 to 16"):
        client.chat.completions.create(model=name, messages=CHAT, n=17)
    with pytest.raises(openai.BadRequestError, match="top_logprobs must be from 0 to 100"):
        client.chat.completions.create(model=name, messages=CHAT, logprobs=True, top_logprobs=101)
    with pytest.raises(openai.BadRequestError, match="unknown field 'frobnicate'"):
        client.chat.completions.create(model=name, messages=CHAT, extra_body={"frobnicate": 1})
    with pytest.raises(openai.BadRequestError, match="past the model's context of 8,192") as e:
        client.chat.completions.create(model=name, messages=CHAT, max_tokens=9000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.post("/embeddings", body={"input": "x", "model": name}, cast_to=object)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "x" * (5 * 2**20)}])
    assert e.value.status_code == 413
    # The server goes on answering after all that. Greedy, since a sampled two-token answer can be the
    # first two bytes of an emoji (SmolLM2 spells one in three tokens), which an answer cut there leaves out.
    after = client.chat.completions.create(model=name, messages=CHAT, max_tokens=2, temperature=0)
    assert after.usage.completion_tokens == 2 and after.choices[0].message.content == "1."


def test_api_key_is_required_when_set(engine):
    from engine.serve import ServeSetupError, start_server

    with pytest.raises(ServeSetupError, match="give an API key"):
        start_server(engine, host="0.0.0.0")
    with start_server(engine, api_key="sesame") as keyed:
        with pytest.raises(openai.AuthenticationError) as e:
            openai.OpenAI(base_url=keyed.url, api_key="wrong", max_retries=0).models.list()
        assert e.value.status_code == 401
        assert openai.OpenAI(base_url=keyed.url, api_key="sesame").models.list().data[0].id == engine.info.name
        assert httpx.get(keyed.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}  # no key needed


def test_tokenize_detokenize_props(server, engine):
    root = server.url.removesuffix("/v1")
    ids = httpx.post(root + "/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids == engine.tokenizer.encode("Hello world", add_special_tokens=False)
    # llama.cpp's `content`, and vLLM's `prompt` (lm-eval's remote tokenizer reads it)
    assert httpx.post(root + "/detokenize", json={"tokens": ids}).json() == {"content": "Hello world",
                                                                             "prompt": "Hello world"}
    bad = httpx.post(root + "/detokenize", json={"tokens": [10**12]})
    assert bad.status_code == 400 and "token id" in bad.json()["error"]["message"]
    props = httpx.get(root + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == engine.info.context_length


def test_eight_streams_at_once_all_finish(client, engine, sink):
    results: dict[int, tuple[str, str | None]] = {}

    def one(i: int) -> None:
        text, reason = "", None
        for chunk in client.completions.create(model=engine.info.name, prompt=f"Item {i}:", max_tokens=6, seed=i,
                                               stream=True):
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        results[i] = (text, reason)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(8)) and all(reason for _, reason in results.values())
    ended = sink.wait_ends(8)
    assert sorted(ex.choices[0].text for ex in ended) == sorted(text for text, _ in results.values())


def _long_stream(server, engine, **extra):
    return httpx.stream("POST", server.url + "/completions", timeout=60, json={
        "model": engine.info.name, "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "ignore_eos": True,
        "stream": True, **extra})


def test_a_client_that_goes_away_cancels_its_generation(server, engine, sink):
    with _long_stream(server, engine) as response:
        lines = response.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
    assert got  # a few tokens arrived, then the client closed the connection
    ex = sink.wait_ends(1, timeout=30)[0]
    assert ex.disconnected and ex.choices[0].finish_reason == "cancelled" and ex.choices[0].stats is None
    assert len(ex.choices[0].events) < 1000
    t0 = time.monotonic()  # the model is free again: the next answer is not behind 4000 tokens
    httpx.post(server.url + "/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60).raise_for_status()
    assert time.monotonic() - t0 < 20


def test_stop_request_ends_the_stream_like_a_finished_answer(server, engine, sink):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    stream = client.completions.create(model=engine.info.name, prompt="Count: 1, 2, 3,", max_tokens=4000,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 3:
            ex_id = sink.wait_starts(1)[0].id
            assert chunk.id == ex_id
            assert server.stop_request(ex_id)
    assert chunks[-1].choices[0].finish_reason == "stop"  # the last chunk says it ended; then [DONE]
    assert 3 <= len(chunks) < 1000
    ex = sink.wait_ends(1)[0]
    assert ex.stopped and not ex.disconnected and ex.choices[0].finish_reason == "stop"
    assert not server.stop_request(ex.id)  # it is over


def test_trace_sink_writes_a_trace_read_trace_reads(client, engine, sink, tmp_path):
    client.chat.completions.create(model=engine.info.name, messages=CHAT, max_tokens=4, n=2, seed=9)
    ex = sink.wait_ends(1)[0]
    TraceDirectorySink(tmp_path, engine.info).on_end(ex)
    (path,) = tmp_path.glob("*.jsonl")
    runs = read_trace(path)
    assert len(runs) == 2
    for run, choice in zip(runs, ex.choices):
        def view(events):
            return [(e.token_id, e.text, e.logprob, [(p.token_id, p.logprob) for p in e.top_model], len(e.stages))
                    for e in events]

        assert view(run.events()) == view(choice.events)
        assert run.header["served"]["client"] == ex.client and run.header["seed"] == choice.stats.seed
        assert run.header["settings"]["seed"] == 9 and run.end["text"] == choice.text


def test_a_served_trace_replays_identically(client, engine, sink, tmp_path, capsys):
    from cli_checks import run_cli

    client.chat.completions.create(model=engine.info.name, messages=CHAT, max_tokens=6, seed=4, temperature=0.9)
    TraceDirectorySink(tmp_path, engine.info).on_end(sink.wait_ends(1)[0])
    (path,) = tmp_path.glob("*.jsonl")
    capsys.readouterr()
    assert run_cli(["replay", str(path)]) == 0
    assert "run 0: identical" in capsys.readouterr().out


def _background_stream(server, engine, started: threading.Event, lines: list[str]) -> threading.Thread:
    """A long answer streamed on a thread (it holds the model); its lines are kept."""
    def read() -> None:
        with _long_stream(server, engine) as response:
            for line in response.iter_lines():
                lines.append(line)
                started.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert started.wait(60)
    return thread


def test_an_answer_stopped_before_its_turn_still_ends_with_a_last_chunk(server, engine, sink):
    """Stop on an answer still waiting for the model: the client got `[DONE]` with no chunk saying it stopped."""
    started, first_lines = threading.Event(), []
    first = _background_stream(server, engine, started, first_lines)
    first_id = sink.wait_starts(1)[0].id
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model=engine.info.name, messages=CHAT, max_tokens=50, stream=True)
    chunks = []
    for chunk in stream:  # its first chunk (the role) comes before its turn
        chunks.append(chunk)
        if len(chunks) == 1:
            waiting = sink.wait_starts(2)[1].id
            assert chunk.id == waiting and server.stop_request(waiting)
    assert [c.choices[0].finish_reason for c in chunks] == [None, "stop"]  # the last chunk, then [DONE]
    assert server.stop_request(first_id)
    first.join(30)
    ended = {ex.id: ex for ex in sink.wait_ends(2)}
    assert ended[waiting].stopped and ended[waiting].choices[0].finish_reason == "stop"
    assert not ended[waiting].choices[0].events and ended[waiting].error is None


def test_a_request_waiting_when_the_model_closes_gets_an_error_event_not_a_broken_stream():
    """The model closed (another model, quitting) while a request waited: the ASGI app raised ("Exception in ASGI
    application") and the client's stream broke off; now it ends with OpenAI's error event and `[DONE]`."""
    with served_default_model() as (engine, server, sink):
        started, first_lines = threading.Event(), []
        first = _background_stream(server, engine, started, first_lines)
        sink.wait_starts(1)
        lines: list[str] = []

        def second() -> None:
            with httpx.stream("POST", server.url + "/chat/completions", timeout=60, json={
                    "model": engine.info.name, "messages": CHAT, "max_tokens": 20, "stream": True}) as response:
                lines.extend(response.iter_lines())

        waiting = threading.Thread(target=second, daemon=True)
        waiting.start()
        sink.wait_starts(2)
        engine.close(cancel=True)
        waiting.join(30)
        first.join(30)
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert "closed" in error["message"], error
