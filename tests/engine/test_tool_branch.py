"""A branch inside a tool call (the default model, SmolLM2 on llama.cpp, the built-in format): the tools' grammar
and the call's reader start after the kept tokens (`assistant_prefix`), so the answer continues the same call.

Without that, the grammar asks for the call's opener again at the branch point (a forced argument token is a dead
end) and the reader sees the new tokens as text: no call is parsed and the positions are wrong.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

from test_tools_model import ADD, ASK, SCHEMAS, WEATHER  # the tools the model tests use, one definition


def _run(backend, seed, prefix=(), forced=()):
    backend.trim_cache(0)
    request = GenerationRequest(messages=ASK, tools=[WEATHER, ADD], tool_choice="required", max_new_tokens=64,
                                assistant_prefix=prefix, forced_tokens=forced,
                                sampler=SamplerSettings(seed=seed, temperature=1.0))
    events = list(generate_events(backend, request))
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, TokenEvent)], done.stats


def _first_argument_value_token(events):
    """The index of the first token inside an argument's value (after its key)."""
    seen_key = False
    for i, e in enumerate(events):
        if e.tool_position and e.tool_position.startswith("arguments."):
            if seen_key and e.text.strip() not in ("", ":", '"', ': "'):
                return i
            seen_key = True
    raise AssertionError(f"no argument value in {[e.tool_position for e in events]}")


@pytest.fixture(scope="module")
def original(default_llamacpp):
    events, stats = _run(default_llamacpp, seed=1)
    assert stats.finish_reason == "tool_calls" and len(stats.tool_calls) == 1, stats.text
    return events, stats


@pytest.mark.slow
def test_a_branch_replaying_the_rest_gives_the_same_call_and_positions(default_llamacpp, original):
    events, stats = original
    k = _first_argument_value_token(events)
    ids = tuple(e.token_id for e in events)
    again, stats2 = _run(default_llamacpp, seed=2, prefix=ids[:k], forced=ids[k:])
    assert stats2.error is None and stats2.finish_reason == "tool_calls", (stats2.error, stats2.text)
    assert [(c.name, c.arguments) for c in stats2.tool_calls] == [(c.name, c.arguments) for c in stats.tool_calls]
    assert [e.tool_position for e in again] == [e.tool_position for e in events[k:]]


@pytest.mark.slow
def test_a_branch_at_an_argument_token_continues_the_same_call(default_llamacpp, original):
    events, stats = original
    k = _first_argument_value_token(events)
    ids = tuple(e.token_id for e in events)
    others = [t.token_id for t in events[k].top_sampler if t.token_id != ids[k]]
    forced = (others[0],) if others else ()  # another value the grammar allowed there, when there is one
    new, branched = _run(default_llamacpp, seed=3, prefix=ids[:k], forced=forced)
    assert branched.finish_reason == "tool_calls", (branched.error, branched.text)
    (call,) = branched.tool_calls
    assert call.name == stats.tool_calls[0].name  # the kept name: the branch did not start a new call
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    positions = [e.tool_position for e in new]
    assert positions[0] is not None and positions[0].startswith("arguments")  # still in the call's arguments
    assert "opener" not in positions and "name" not in positions
    assert positions[-1] == "closer" and branched.text.endswith("</tool_call>")


@pytest.mark.slow
def test_a_kept_part_the_tools_do_not_allow_is_said_in_words(default_llamacpp):
    prefix = tuple(default_llamacpp.tokenizer.encode("Hello there", add_special_tokens=False))
    events, stats = _run(default_llamacpp, seed=1, prefix=prefix)  # "required": the answer must be a call
    assert stats.finish_reason == "error" and not events
    assert "kept part is not text or a call the tools allow" in (stats.error or "")
