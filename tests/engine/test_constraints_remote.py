"""A constraint on a model on a server (llama-cpp-python's server on 127.0.0.1, the default model).

We sample: the mask applies to the server's top N only, checked byte by byte, and the stage says so.
The server samples: the constraint goes to the server in the fields it reads, or is refused in words.
"""

from __future__ import annotations

import json

import pytest

from engine.backends.remote.errors import UnsupportedByServerError
from engine.constraints import Constraint
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def remote(llama_server_url):
    from engine.backends.remote import RemoteBackend

    backend = RemoteBackend.connect(llama_server_url)
    yield backend
    backend.close()


def test_we_sample_masks_the_servers_top_n(remote):
    request = GenerationRequest(messages=({"role": "user", "content": "Pick a colour."},),
                                sampler=SamplerSettings(temperature=0.0), max_new_tokens=8,
                                constraint=Constraint.choice(["red", "green", "blue"]))
    events = list(remote.events(request, None))
    done = events[-1]
    assert isinstance(done, Done) and done.stats.text in ("red", "green", "blue"), done.stats
    steps = [e.constraint for e in events if isinstance(e, TokenEvent)]
    assert steps and all("top" in s.note and "only" in s.note for s in steps)
    assert steps[0].disallowed  # the server's favourites that are not a colour were removed


@pytest.mark.slow
def test_server_sampling_follows_the_constraint_sent_to_it(remote):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    for constraint, check in (
        (Constraint.choice(["red", "green", "blue"]), lambda text: text in ("red", "green", "blue")),
        (Constraint.gbnf('root ::= "The answer is " [0-9] "."'), lambda text: text[:14] == "The answer is " and text[-1] == "."),
        (Constraint.json_schema(schema), lambda text: jsonschema.validate(json.loads(text), schema) is None),
    ):
        request = GenerationRequest(messages=({"role": "user", "content": "Name a colour, a number or a city."},),
                                    sampler=SamplerSettings(temperature=0.0, seed=1), max_new_tokens=40,
                                    server_sampling=True, constraint=constraint)
        done = list(remote.events(request, None))[-1]
        assert isinstance(done, Done) and check(done.stats.text), (constraint.kind, done.stats)


def test_server_sampling_refuses_a_constraint_it_cannot_take_in_words(remote):
    request = GenerationRequest(prompt="x", server_sampling=True, constraint=Constraint.regex("[0-9]+"))
    with pytest.raises(UnsupportedByServerError, match="cannot be given a regular expression constraint"):
        list(remote.events(request, None))


@pytest.mark.parametrize(("kind", "constraint", "fields"), [
    ("vllm", Constraint.regex("[0-9]+"), {"structured_outputs": {"regex": "[0-9]+"}}),
    ("vllm", Constraint.choice(["a", "b"]), {"structured_outputs": {"choice": ["a", "b"]}}),
    ("llama.cpp", Constraint.json_schema({"type": "integer"}), {"json_schema": {"type": "integer"}}),
    ("llama.cpp", Constraint.choice(["a", "b"]), {"grammar": 'root ::= "a" | "b"'}),
    ("sglang", Constraint.regex("x+"), {"regex": "x+"}),
    ("openai", Constraint.json_schema({"type": "integer"}),
     {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "integer"}}}}),
])
def test_each_server_gets_the_fields_it_reads(kind, constraint, fields):
    from engine.backends.remote.server_constraint import constraint_fields

    assert constraint_fields(constraint, kind, True, "host") == fields
