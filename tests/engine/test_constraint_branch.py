"""A branch inside a structured answer (the default model on llama.cpp, a JSON schema): the request's own constraint
starts after the kept tokens (`assistant_prefix`), as the tools' grammar does (test_tool_branch.py).

Before, the grammar started afresh at the branch point: in the middle of an object it asked for a new one, so the
branch's text joined to the kept part was not JSON, and a forced value token there was a dead end.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.constraints import Constraint
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Give the largest city of France and its population as JSON."}]


def _run(backend, seed, prefix=(), forced=(), constraint=Constraint("json_schema", json.dumps(SCHEMA))):
    backend.trim_cache(0)
    request = GenerationRequest(messages=ASK, constraint=constraint, max_new_tokens=48, assistant_prefix=prefix,
                                forced_tokens=forced, sampler=SamplerSettings(seed=seed, temperature=1.0))
    events = list(generate_events(backend, request))
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, TokenEvent)], done.stats


@pytest.fixture(scope="module")
def original(default_llamacpp):
    events, stats = _run(default_llamacpp, seed=1)
    assert stats.error is None and stats.finish_reason == "eos", (stats.error, stats.text)
    jsonschema.validate(json.loads(stats.text), SCHEMA)
    return events, stats


def _inside_the_object(events) -> int:
    """The index of the first token after the object's first key, so the kept part is an unfinished object."""
    text = ""
    for i, e in enumerate(events):
        text += e.text
        if '"city"' in text:
            return i + 1
    raise AssertionError(f"no city key in {text!r}")


def test_a_branch_inside_the_object_finishes_the_same_object(default_llamacpp, original):
    events, _ = original
    k = _inside_the_object(events)
    ids = tuple(e.token_id for e in events)
    kept = "".join(e.text for e in events[:k])
    new, stats = _run(default_llamacpp, seed=5, prefix=ids[:k])
    assert stats.error is None and stats.finish_reason == "eos", (stats.error, stats.text)
    whole = kept + "".join(e.text for e in new)
    jsonschema.validate(json.loads(whole), SCHEMA)  # before: a fresh object after the kept '{"city"'


def test_a_forced_value_token_inside_the_object_is_not_a_dead_end(default_llamacpp, original):
    events, _ = original
    k = _inside_the_object(events)
    ids = tuple(e.token_id for e in events)
    new, stats = _run(default_llamacpp, seed=6, prefix=ids[:k], forced=(ids[k],))
    assert stats.error is None and stats.finish_reason == "eos", (stats.error, stats.text)
    assert new[0].token_id == ids[k]
    jsonschema.validate(json.loads("".join(e.text for e in events[:k]) + "".join(e.text for e in new)), SCHEMA)


def test_a_kept_part_the_constraint_refuses_is_said_in_words(default_llamacpp, original):
    events, _ = original
    kept = tuple(e.token_id for e in events[:3])  # '{"' ... : no digit-only answer starts like that
    _, stats = _run(default_llamacpp, seed=7, prefix=kept, constraint=Constraint("regex", "[0-9]+"))
    assert stats.finish_reason == "error" and stats.text == "", (stats.finish_reason, stats.text)
    assert "kept part does not fit the structured output" in stats.error and "regular expression" in stats.error, stats.error
