"""The loom's N children on a server that samples: one request with the API's `n`, one by one where it cannot.

Scripted servers on 127.0.0.1 (tests/remote_server.py: `FakeServer` with a `CharModel` that honours `n` as
vLLM streams it, ignores it, or refuses it), and llama-cpp-python's real server on the default model.
"""

from __future__ import annotations

import logging
import math
import threading

import pytest

from engine import GenerationRequest, SamplerSettings
from engine.backends.remote import RemoteBackend, ServerResponseError
from engine.backends.remote.generate import remote_events
from engine.events import Done, TokenEvent
from engine.loom import continuation_events
from engine.loom.continuations import collect
from remote_server import CharModel, FakeServer, Reply

PROBS = {"a": 0.5, "b": 0.2, "c": 0.1, "d": 0.05, "e": 0.05, "f": 0.04, "g": 0.03}
PROMPT = "Once upon a time, there was"
LOGGER = "engine.backends.remote.many_choices"

pytestmark = pytest.mark.slow  # each connects to a server (its probe) and takes about a second here


def streamed(server: FakeServer) -> list[dict]:
    """The bodies of the streamed completion requests the server got, in order (the probe's are not streamed)."""
    return [b for _, p, b in server.requests if p == "/v1/completions" and isinstance(b, dict) and b.get("stream")]


def request(seed: int = 7, max_new_tokens: int = 4, **kw) -> GenerationRequest:
    return GenerationRequest(prompt=PROMPT, max_new_tokens=max_new_tokens, top_n=5, server_sampling=True,
                             sampler=SamplerSettings(seed=seed), **kw)


def one_done_per_row(events, n: int) -> None:
    for r in range(n):
        row = [e.event for e in events if e.row == r]
        assert sum(isinstance(e, Done) for e in row) == 1 and isinstance(row[-1], Done), f"row {r}"


def test_a_server_that_honours_n_streams_every_child_in_one_request(serve):
    server = serve(CharModel(PROBS, kind="vllm", n_choices="honour"))
    backend = RemoteBackend.connect(server.url)
    events = list(continuation_events(backend, request(), 4))

    bodies = streamed(server)
    assert len(bodies) == 1 and bodies[0]["n"] == 4 and bodies[0]["seed"] == 7  # one request for the four children
    one_done_per_row(events, 4)
    # The chunks came interleaved (one per choice, round by round) and were routed by their index, as they came.
    assert [e.row for e in events[:4]] == [0, 1, 2, 3]
    tokens, stats = collect(events, 4)
    chars = list(PROBS)
    for r in range(4):
        want = chars[r] * min(4, 2 + r % 3)  # the scripted server's choice r (see CharModel.choice_chunks)
        assert "".join(t.text for t in tokens[r]) == want == stats[r].text
        assert [t.token_id for t in tokens[r]] == [ord(chars[r])] * len(want) == list(stats[r].token_ids)
        assert [t.index for t in tokens[r]] == list(range(len(want)))
        for t in tokens[r]:  # each token's log-prob and alternatives are that choice's, as the server sent them
            assert t.logprob == pytest.approx(math.log(PROBS[chars[r]]))
            assert t.rank == r and [p.text for p in t.top_model if not p.is_rest] == chars[:5]
        # One request, one seed: every child reports it (the loom records each child's row beside it).
        assert stats[r].seed == 7 and stats[r].error is None
        assert stats[r].prompt_tokens == len(PROMPT)  # from the usage chunk that ends the stream
        assert stats[r].finish_reason == ("length" if len(want) == 4 else "eos")
    assert backend.caps.many_choices is True


def test_cancel_mid_stream_ends_every_child_cancelled_with_its_tokens(serve):
    server = serve(CharModel(PROBS, kind="vllm", n_choices="honour", stream_gap=0.05))
    backend = RemoteBackend.connect(server.url)
    cancel = threading.Event()
    events = []
    for e in continuation_events(backend, request(max_new_tokens=4), 3, cancel=cancel):
        events.append(e)
        if sum(isinstance(x.event, TokenEvent) for x in events) == 4:
            cancel.set()  # every child has a token; child 0 has two
    one_done_per_row(events, 3)
    tokens, stats = collect(events, 3)
    assert [len(t) for t in tokens] == [2, 1, 1]
    for r in range(3):
        assert stats[r].finish_reason == "cancelled"
        assert list(stats[r].token_ids) == [t.token_id for t in tokens[r]]  # the tokens so far are kept
        assert stats[r].text == "".join(t.text for t in tokens[r])
    assert len(streamed(server)) == 1  # a cancelled run asks no child again


@pytest.mark.parametrize("behaviour, why", [("ignore", "ignores n"), ("refuse", "Only one completion choice")])
def test_a_server_without_n_gets_one_request_per_child_once_and_is_remembered(serve, caplog, behaviour, why):
    server = serve(CharModel(PROBS, n_choices=behaviour))
    backend = RemoteBackend.connect(server.url)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        events = list(continuation_events(backend, request(seed=40), 3))
    bodies = streamed(server)
    # It was asked once for all three; then the children it did not make went one request each, child r with
    # seed 40 + r, as the loom runs them on any model without a batch.
    assert bodies[0]["n"] == 3 and bodies[0]["seed"] == 40
    rest = bodies[1:] if behaviour == "refuse" else [{"seed": 40}] + bodies[1:]
    assert [b["seed"] for b in rest] == [40, 41, 42] and all("n" not in b for b in bodies[1:])
    one_done_per_row(events, 3)
    tokens, stats = collect(events, 3)
    for r in range(3):
        assert stats[r].text == "aaa" == "".join(t.text for t in tokens[r]) and stats[r].seed == 40 + r
    said = [rec.getMessage() for rec in caplog.records if rec.name == LOGGER]
    assert len(said) == 1 and why in said[0] and server.url.split("/")[2] in said[0]
    assert backend.caps.many_choices is False

    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        again = list(continuation_events(backend, request(seed=50), 3))
    later = streamed(server)[len(bodies):]
    assert [b["seed"] for b in later] == [50, 51, 52] and all("n" not in b for b in later)  # not asked again
    assert not [rec for rec in caplog.records if rec.name == LOGGER]
    one_done_per_row(again, 3)


def test_a_refusal_that_is_not_about_n_reaches_the_user_and_is_not_remembered(serve):
    model = CharModel(PROBS, n_choices="honour")
    refusal = Reply({"error": {"message": "the prompt is too long for this model"}}, 400)
    server = serve(lambda m, p, b: refusal if isinstance(b, dict) and b.get("stream") else model(m, p, b))
    backend = RemoteBackend.connect(server.url)
    with pytest.raises(ServerResponseError, match="too long"):
        list(continuation_events(backend, request(), 3))
    assert len(streamed(server)) == 2  # with n, then without: the same refusal, so n was not the cause
    assert backend.caps.many_choices is None


def test_we_sample_on_a_server_keeps_one_child_after_another(serve):
    server = serve(CharModel(PROBS, n_choices="honour"))
    backend = RemoteBackend.connect(server.url)
    req = GenerationRequest(prompt=PROMPT, max_new_tokens=2, top_n=5, sampler=SamplerSettings(seed=3))
    events = list(continuation_events(backend, req, 2))
    one_done_per_row(events, 2)
    assert all("n" not in b for _, p, b in server.requests if isinstance(b, dict))
    assert backend.caps.many_choices is None


# --- llama-cpp-python's server (the `llama_server_url` fixture): it has no `n` and answers one choice ----------


def test_loom_on_llama_cpp_python_server_makes_n_children(llama_server_url, caplog):
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the test extra)")
    backend = RemoteBackend.connect(llama_server_url)
    try:
        assert backend.caps.seed  # a seeded sample is reproducible there, so each child can be checked
        with caplog.at_level(logging.INFO, logger=LOGGER):
            events = list(continuation_events(backend, request(seed=11, max_new_tokens=5), 3))
        one_done_per_row(events, 3)
        tokens, stats = collect(events, 3)
        for r in range(3):
            assert stats[r].finish_reason in ("length", "eos") and stats[r].error is None
            assert len(stats[r].token_ids) == len(tokens[r]) > 0  # ids it did not stream are learned after, in Done
            assert stats[r].text == "".join(t.text for t in tokens[r])
        if backend.caps.many_choices is False:  # it ignored (or refused) n: child r is the request with seed 11 + r
            assert any("one request each" in rec.getMessage() for rec in caplog.records if rec.name == LOGGER)
            for r in range(3):
                alone = list(remote_events(backend, request(seed=11 + r, max_new_tokens=5)))
                assert alone[-1].stats.text == stats[r].text and alone[-1].stats.seed == stats[r].seed == 11 + r
        else:  # it honoured n: one request, one seed
            assert backend.caps.many_choices is True and {s.seed for s in stats} == {11}
    finally:
        backend.close()


# --- vLLM (optional: $LOGITLAB_VLLM_PYTHON, see tests/engine/test_remote_vllm.py): it honours n ----------------


@pytest.fixture(scope="module")
def vllm_backend(request):
    from remote_server import running_vllm_server, vllm_python_problem

    problem = vllm_python_problem()
    if problem:
        pytest.skip(f"no vLLM to test against: {problem}")
    folder = request.getfixturevalue("default_model_folder")
    with running_vllm_server(str(folder)) as url:
        backend = RemoteBackend.connect(url)
        yield backend
        backend.close()


def test_loom_on_vllm_is_one_request_with_n(vllm_backend, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        events = list(continuation_events(vllm_backend, request(seed=5, max_new_tokens=6), 3))
    assert vllm_backend.caps.many_choices is True
    assert not [rec for rec in caplog.records if rec.name == LOGGER]  # no child went alone
    one_done_per_row(events, 3)
    tokens, stats = collect(events, 3)
    for r in range(3):
        assert stats[r].seed == 5 and stats[r].error is None  # one request, one seed
        assert list(stats[r].token_ids) == [t.token_id for t in tokens[r]] and all(t.token_id >= 0 for t in tokens[r])
        assert stats[r].text == "".join(t.text for t in tokens[r]) and len(tokens[r]) == stats[r].generated_tokens
    assert len({s.text for s in stats}) > 1, [s.text for s in stats]  # three draws, not one answer three times
