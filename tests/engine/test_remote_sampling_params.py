"""Server sampling passes every setting the server has a parameter for, and names, in one refusal, the rest.

Against servers on 127.0.0.1 only: a scripted llama.cpp-style server (tests/remote_server.py `FakeServer`,
which records each request body) and llama-cpp-python's real server on the default model.
"""

from __future__ import annotations

import math

import pytest

from engine import GenerationRequest, SamplerSettings
from engine.backends.remote import RemoteBackend, UnsupportedByServerError
from engine.backends.remote.generate import remote_events
from engine.events import Done
from remote_server import CharModel, FakeServer

PROBS = {"a": 0.5, "b": 0.2, "c": 0.1, "d": 0.05, "e": 0.05}


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def start(kind: str) -> FakeServer:
        model = CharModel(PROBS, kind=kind)
        servers.append(FakeServer(lambda *a: model(*a)))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def answer(backend, sampler: SamplerSettings, prompt: str = "Once upon a time") -> list:
    return list(remote_events(backend, GenerationRequest(prompt=prompt, sampler=sampler, max_new_tokens=3,
                                                         server_sampling=True, top_n=2)))


def sent_body(server: FakeServer) -> dict:
    return [body for method, path, body in server.requests if path == "/v1/completions" and body.get("stream")][-1]


@pytest.mark.slow
def test_llamacpp_server_gets_every_new_setting_under_its_own_names(fake):
    server = fake("llama.cpp")
    backend = RemoteBackend.connect(server.url)
    s = SamplerSettings(temperature=0.9, dynatemp_range=0.3, dynatemp_exponent=1.5, top_n_sigma=1.2, typical_p=0.9,
                        dry_multiplier=0.8, dry_base=2.0, dry_allowed_length=3, dry_penalty_last_n=128,
                        dry_sequence_breakers=("\n", "Narrator:"), xtc_probability=0.4, xtc_threshold=0.2,
                        logit_bias=((98, -math.inf), ("hello", 1.5)), repetition_penalty=1.1, penalty_last_n=32,
                        adaptive_target=0.3, adaptive_decay=0.5, seed=11)
    events = answer(backend, s)
    assert isinstance(events[-1], Done) and events[-1].stats.error is None
    body = sent_body(server)
    assert {k: body[k] for k in ("temperature", "dynatemp_range", "dynatemp_exponent", "top_n_sigma", "typical_p",
                                 "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                                 "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "repeat_penalty",
                                 "repeat_last_n", "adaptive_target", "adaptive_decay", "mirostat")} == {
        "temperature": 0.9, "dynatemp_range": 0.3, "dynatemp_exponent": 1.5, "top_n_sigma": 1.2, "typical_p": 0.9,
        "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3, "dry_penalty_last_n": 128,
        "dry_sequence_breakers": ["\n", "Narrator:"], "xtc_probability": 0.4, "xtc_threshold": 0.2,
        "repeat_penalty": 1.1, "repeat_last_n": 32, "adaptive_target": 0.3, "adaptive_decay": 0.5, "mirostat": 0}
    assert body["logit_bias"] == [[98, False], ["hello", 1.5]]  # a ban as llama.cpp spells it (JSON has no -inf)
    # The stage order travels too, in llama.cpp's names, adaptive-p last (it picks the token there).
    assert body["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                "temperature", "adaptive_p"]
    order = [n for n in s.order if n != "temperature"]
    order.insert(order.index("penalties") + 1, "temperature")
    answer(backend, s.with_(order=tuple(order)))
    assert sent_body(server)["samplers"][:3] == ["penalties", "temperature", "dry"]
    backend.close()


@pytest.mark.slow
def test_what_llamacpp_cannot_do_is_named_once_before_anything_is_sent(fake):
    server = fake("llama.cpp")
    backend = RemoteBackend.connect(server.url)
    before = len(server.requests)
    s = SamplerSettings(smoothing_factor=0.3, banned_strings=("a tapestry",), mirostat=2, top_k=40)
    with pytest.raises(UnsupportedByServerError) as info:
        answer(backend, s)
    words = str(info.value)
    assert "smoothing_factor=0.3" in words and "banned_strings" in words
    assert "mirostat with smoothing, top-k" in words and "runs only logit bias, temperature and mirostat" in words
    assert words.count("a llama.cpp server cannot take") == 1
    assert len(server.requests) == before
    backend.close()


@pytest.mark.slow
def test_a_vllm_server_takes_ids_in_logit_bias_and_names_the_stages_it_lacks(fake):
    server = fake("vllm")
    backend = RemoteBackend.connect(server.url)
    answer(backend, SamplerSettings(logit_bias=((98, -math.inf), (99, 3.0)), temperature=0.5))
    assert sent_body(server)["logit_bias"] == {"98": -100.0, "99": 3.0}
    with pytest.raises(UnsupportedByServerError) as info:
        answer(backend, SamplerSettings(dry_multiplier=0.8, top_n_sigma=1.0, mirostat=2, logit_bias={"hi": 2}))
    words = str(info.value)
    for name in ("dry_multiplier=0.8", "top_n_sigma=1.0", "mirostat=2", "logit_bias by text ('hi'"):
        assert name in words
    backend.close()


@pytest.fixture(scope="module")
def real(llama_server_url):
    backend = RemoteBackend.connect(llama_server_url)
    yield backend
    backend.close()


def test_a_real_server_applies_the_logit_bias_and_mirostat_it_is_sent(real):
    greedy = SamplerSettings(temperature=0)
    plain = answer(real, greedy)
    first_id, first_text = plain[-1].stats.token_ids[0], plain[0].token_text  # ids are learnt after the stream
    banned = answer(real, greedy.with_(logit_bias=((first_id, -math.inf),)))
    assert banned[-1].stats.token_ids[0] != first_id  # the server banned the greedy token
    by_text = answer(real, greedy.with_(logit_bias=((first_text, -math.inf),)))
    assert by_text[-1].stats.token_ids[0] != first_id  # a text is tokenized by the server (logit_bias_type "tokens")
    done = answer(real, SamplerSettings(mirostat=2, mirostat_tau=3.0, seed=5))[-1]
    assert done.stats.error is None and done.stats.generated_tokens == 3
    with pytest.raises(UnsupportedByServerError, match="dry_multiplier=0.8"):
        answer(real, SamplerSettings(dry_multiplier=0.8))
