"""Every constrained answer parses and validates against its schema (hypothesis over schemas, seeds, settings).

The default model on llama.cpp; the validator is `jsonschema`, not ours. ~15 answers, ~10 s on two cores.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.constraints import Constraint
from engine.decode.loop import generate_events
from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

NAMES = ("name", "age", "city", "ok", "tags", "color")
LEAF = st.one_of(
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.integers(1, 10).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.sampled_from(["red", "green", "blue", "x y"]), min_size=1, max_size=3, unique=True).map(
        lambda e: {"enum": e}),
    st.integers(0, 3).map(lambda n: {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "maxItems": n}),
)
SCHEMA = st.dictionaries(st.sampled_from(NAMES), LEAF, min_size=1, max_size=3).map(
    lambda props: {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False})
SAMPLER = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.7, 1.5]),
    "top_k": st.sampled_from([0, 40]),
    "min_p": st.sampled_from([0.0, 0.05]),
    "seed": st.integers(0, 2**31),
})


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMA, sampler=SAMPLER)
def test_every_constrained_answer_validates(default_llamacpp, schema, sampler):
    # Not fewer examples or tokens: 15 drawn schemas and samplers are the property's breadth, 80 tokens a whole object.
    default_llamacpp.trim_cache(0)
    request = GenerationRequest(
        messages=({"role": "user", "content": "Answer with JSON."},), sampler=SamplerSettings(**sampler),
        max_new_tokens=80, constraint=Constraint.json_schema(schema))
    done = list(generate_events(default_llamacpp, request))[-1]
    assert isinstance(done, Done)
    stats = done.stats
    if stats.finish_reason == "eos":
        assert stats.constraint_status == "complete"
        jsonschema.validate(json.loads(stats.text), schema)
    else:  # a long answer: it must say it is unfinished, never pass for a complete one
        assert stats.finish_reason == "length", stats
        if stats.constraint_status == "complete":  # the grammar ended on the last token allowed: only the end
            jsonschema.validate(json.loads(stats.text), schema)  # token was cut, and the object is whole
        else:
            assert stats.constraint_status.startswith("stopped at the length limit inside the grammar")
    assert stats.constraint_logprob is not None and stats.constraint_logprob <= 0
