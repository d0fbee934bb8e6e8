"""Token ids that enter through a server's tokenizer are checked against the vocabulary (issue 36 item 2).

The remote tokenizer had no check of its own: an id of 2**40 from a loom file, the API or step mode was sent
to the server (llama.cpp's aborts on an id past its vocabulary). Now every id that enters through it (decode,
prompt and forced ids, the answer's prefix) is refused with the engine's `TokenIdError` before any request:
against the vocabulary the server states (llama.cpp: /v1/models meta.n_vocab), else a bound past every real
vocabulary. Scripted servers on 127.0.0.1 (tests/remote_server.py).
"""

from __future__ import annotations

import pytest

from engine import GenerationRequest, SamplerSettings
from engine.backends.remote import RemoteBackend
from engine.backends.remote.checks import MAX_TOKEN_ID
from engine.backends.remote.generate import remote_events
from engine.errors import TokenIdError
from remote_server import CharModel, Reply

PROBS = {"a": 0.5, "b": 0.2, "c": 0.1, "d": 0.05, "e": 0.05}
N_VOCAB = 256  # the character model's ids are code points: 'a' is 97


def stating(model: CharModel, n_vocab):
    """The model's server, whose /v1/models states `n_vocab` as llama.cpp's does (meta.n_vocab)."""

    def handler(method, path, body):
        if path == "/v1/models":
            return Reply({"object": "list", "data": [{"id": "char-model", "object": "model", "owned_by": "llamacpp",
                                                      "meta": {"n_vocab": n_vocab, "n_ctx_train": 4096}}]})
        return model(method, path, body)

    return handler


def detokenize_requests(server) -> list:
    return [body for _method, path, body in server.requests if path == "/detokenize"]


@pytest.fixture
def stated(serve):
    server = serve(stating(CharModel(PROBS), N_VOCAB))
    backend = RemoteBackend.connect(server.url)
    yield server, backend
    backend.close()


@pytest.fixture
def unstated(serve):
    server = serve(CharModel(PROBS))
    backend = RemoteBackend.connect(server.url)
    yield server, backend
    backend.close()


@pytest.mark.slow
def test_decode_checks_ids_against_the_vocabulary_the_server_states(stated):
    server, backend = stated
    tok = backend.tokenizer
    assert backend.caps.n_vocab == N_VOCAB and tok.n_vocab == N_VOCAB
    assert tok.decode([97, 98]) == "ab"
    asked = len(detokenize_requests(server))
    for bad in (N_VOCAB, 1_000_000, -7, 2**40):
        with pytest.raises(TokenIdError, match=f"{bad}.*outside this model's vocabulary \\(0..255\\)"):
            tok.decode([97, bad])
        with pytest.raises(TokenIdError):
            tok.token_text(bad)
        with pytest.raises(TokenIdError):
            tok.token_bytes(bad)
    with pytest.raises(TokenIdError, match="not an integer"):
        tok.decode([97, "x"])
    assert len(detokenize_requests(server)) == asked  # none of them was sent


@pytest.mark.slow
def test_without_a_stated_vocabulary_ids_past_any_real_one_are_refused(unstated):
    server, backend = unstated
    tok = backend.tokenizer
    assert backend.caps.n_vocab == 0
    asked = len(detokenize_requests(server))
    for bad in (2**40, MAX_TOKEN_ID + 1, -7):
        with pytest.raises(TokenIdError):
            tok.decode([bad])
    with pytest.raises(TokenIdError, match="beyond any vocabulary"):
        tok.text_for([97, 2**40])
    assert len(detokenize_requests(server)) == asked
    assert tok.decode([97]) == "a"  # a real id still decodes


def _completions(server) -> int:
    return sum(path.startswith("/v1/") and path != "/v1/models" for _m, path, _b in server.requests)


@pytest.mark.slow
@pytest.mark.parametrize("field", ["prompt_ids", "assistant_prefix", "forced_tokens"])
def test_prompt_prefix_and_forced_ids_are_checked_before_anything_is_sent(stated, field):
    server, backend = stated
    before = _completions(server)
    values = {"prompt_ids": (97, 98, 5000)} if field == "prompt_ids" else {"prompt": "Once upon a", field: (97, 5000)}
    with pytest.raises(TokenIdError, match="5000"):
        list(remote_events(backend, GenerationRequest(**values, max_new_tokens=2, sampler=SamplerSettings(seed=1))))
    assert _completions(server) == before


@pytest.mark.slow
def test_server_sampling_checks_the_ids_it_sends(stated):
    server, backend = stated
    before = _completions(server)
    for values in ({"prompt_ids": (97, 2**40)}, {"prompt": "Once", "assistant_prefix": (-3,)}):
        with pytest.raises(TokenIdError):
            list(remote_events(backend, GenerationRequest(**values, max_new_tokens=2, server_sampling=True)))
    assert _completions(server) == before


@pytest.mark.slow
def test_a_step_mode_pick_outside_the_vocabulary_is_refused(stated):
    _server, backend = stated
    backend.forward([97, 98])  # a prompt
    with pytest.raises(TokenIdError, match="300"):
        backend.forward([300])  # the id a step-mode pick (or a hostile file) brings
    backend.forward([99])  # the run goes on with a real one


@pytest.mark.slow
def test_the_research_api_refuses_ids_past_any_vocabulary_on_a_server_that_states_none(unstated):
    from engine.research import LanguageModel

    server, backend = unstated
    lm = LanguageModel(backend)
    before = _completions(server)
    with pytest.raises(TokenIdError, match="beyond any vocabulary"):
        lm.next_token_logprobs_sync([97, 2**40])
    assert _completions(server) == before
    assert lm.next_token_logprobs_sync([97, 98]).shape[0] > 0  # real ids still work
