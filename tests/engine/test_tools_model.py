"""Tool calling on the default model (SmolLM2 on llama.cpp): its template renders no tools, so the built-in
format does; the constraint keeps every answer to text or a call whose arguments match that tool's schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.decode.loop import generate_events, prompt_ids_for
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings
from engine.tools.render import tool_plan
from engine.tools.spec import ToolChoice, parse_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                      "required": ["a", "b"]}}}
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "add": ADD["function"]["parameters"]}
ASK = ({"role": "user", "content": "What is the weather in Paris?"},)


def _run(backend, choice, seed, max_new_tokens=64, messages=ASK):
    backend.trim_cache(0)
    request = GenerationRequest(messages=messages, tools=[WEATHER, ADD], tool_choice=choice,
                                max_new_tokens=max_new_tokens, sampler=SamplerSettings(seed=seed, temperature=1.0))
    events = list(generate_events(backend, request))
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, TokenEvent)], done.stats


def _check_call(stats):
    assert stats.finish_reason == "tool_calls", stats.text
    assert len(stats.tool_calls) == 1
    call = stats.tool_calls[0]
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert call.id.startswith("call_")
    return call


@pytest.mark.slow
def test_smollm2_template_renders_no_tools_so_the_builtin_block_does(default_llamacpp):
    tok = default_llamacpp.tokenizer
    plan = tool_plan(tok, parse_tools([WEATHER]), ToolChoice("auto"), ASK)
    assert plan.format == "builtin" and not plan.via_template
    plain = tok.decode(prompt_ids_for(tok, GenerationRequest(messages=ASK)))
    with_tools = tok.decode(prompt_ids_for(tok, GenerationRequest(messages=ASK, tools=[WEATHER])))
    assert "get_weather" not in plain
    assert '{"name":"get_weather",' in with_tools and "<tool_call>" in with_tools
    assert with_tools.rstrip().endswith("<|im_start|>assistant")
    # A history with a call and its result renders, the result in a <tool_response> block.
    history = (*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 C and sunny"})
    text = tok.decode(prompt_ids_for(tok, GenerationRequest(messages=history, tools=[WEATHER])))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert '<tool_response id="call_abc">\n18 C and sunny\n</tool_response>' in text
    # tool_choice "none": no tool definitions in the prompt (the model is not to call).
    assert "get_weather" not in tok.decode(prompt_ids_for(tok, GenerationRequest(messages=ASK, tools=[WEATHER],
                                                                                 tool_choice="none")))


@pytest.mark.slow
def test_required_always_yields_a_valid_call_and_ends_the_turn(default_llamacpp):
    for seed in (1, 2, 3):
        events, stats = _run(default_llamacpp, "required", seed)
        _check_call(stats)
        # The turn ends on the completed call: its closer is the last token, no end-of-turn token after it.
        assert stats.text.endswith("</tool_call>") and not events[-1].special
        positions = [e.tool_position for e in events]
        assert positions[0] == "opener" and positions[-1] == "closer"
        assert "name" in positions
        assert any(p and p.startswith("arguments.") for p in positions)
        assert "".join(e.text for e in events if e.tool_position == "name").strip(' ",') == stats.tool_calls[0].name
        # The calls ride on the stats' record as plain JSON (traces write `to_dict`).
        assert json.loads(json.dumps(stats.to_dict()))["tool_calls"][0]["name"] == stats.tool_calls[0].name


@pytest.mark.slow
def test_a_named_tool_forces_that_name(default_llamacpp):
    _, stats = _run(default_llamacpp, {"type": "function", "function": {"name": "add"}}, 2)
    assert _check_call(stats).name == "add"


@pytest.mark.slow
def test_auto_gives_text_or_a_valid_call(default_llamacpp):
    for seed in (1, 2):
        events, stats = _run(default_llamacpp, "auto", seed, max_new_tokens=48)
        if stats.tool_calls:
            _check_call(stats)
        else:
            assert "<tool_call>" not in stats.text and stats.finish_reason in ("eos", "length")
            assert all(e.tool_position is None for e in events)


# Qwen 2.5's template, shortened (its system block, calls and tool results as Qwen writes them).
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}

# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{%- for tool_call in message.tool_calls %}{% set tool_call = tool_call.function %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.mark.slow
def test_a_template_that_renders_tools_carries_them_and_its_format_is_followed(default_llamacpp):
    tok = default_llamacpp.tokenizer
    before = tok.template_override
    tok.template_override = HERMES_TEMPLATE
    try:
        plan = tool_plan(tok, parse_tools([WEATHER, ADD]), ToolChoice("required"), ASK)
        assert plan.format == "hermes" and plan.via_template
        history = (*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "18 C"})
        text = tok.decode(prompt_ids_for(tok, GenerationRequest(messages=history, tools=[WEATHER])))
        assert "<tools>\n" + json.dumps(WEATHER, separators=(", ", ": ")) in text or '"name": "get_weather"' in text
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
        assert "<tool_response>\n18 C\n</tool_response>" in text
        assert "You can call these tools" not in text  # the template's own text, not the built-in block
        _, stats = _run(default_llamacpp, "required", 1)
        call = _check_call(stats)
        assert stats.text.startswith('<tool_call>\n{"name": "' + call.name) and stats.text.endswith("}\n</tool_call>")
    finally:
        tok.template_override = before


@pytest.mark.slow
def test_a_banned_string_inside_a_call_steps_back_and_the_call_is_followed_again(default_llamacpp):
    default_llamacpp.trim_cache(0)
    request = GenerationRequest(messages=ASK, tools=[WEATHER], tool_choice="required", max_new_tokens=64,
                                sampler=SamplerSettings(seed=1, temperature=1.0, banned_strings=("Paris",)))
    events = [e for e in generate_events(default_llamacpp, request)]
    stats = events[-1].stats
    call = _check_call(stats)
    assert "Paris" not in call.arguments
    kept = {}
    for e in events[:-1]:  # a step back voids the events from its index on
        kept = {i: p for i, p in kept.items() if i < e.index}
        kept[e.index] = e.tool_position
    assert any(e.rewind is not None for e in events[:-1])
    positions = [kept[i] for i in sorted(kept)]
    assert positions[0] == "opener" and positions[-1] == "closer" and "arguments.city" in positions


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_a_call_that_reads_as_no_call_ends_as_text_and_says_so(default_llamacpp, monkeypatch):
    """Where no grammar holds the answer (here: taken away, as on a path without one), a model can write a call's
    end around something that is no call: the answer ended "tool_calls" with no call in it, and a server sent
    exactly that. It is text then, with a note."""
    import engine.decode.row as decode_row

    monkeypatch.setattr(decode_row, "tool_constraint", lambda tools, tok: None)
    tok = default_llamacpp.tokenizer
    written = 'I will check. <tool_call>{"name": "get_weather", "arguments": {<arguments as JSON>}}</tool_call>'
    default_llamacpp.trim_cache(0)
    request = GenerationRequest(messages=ASK, tools=[WEATHER, ADD], tool_choice="auto", max_new_tokens=64,
                                forced_tokens=tuple(tok.encode(written, add_special_tokens=False)))
    done = list(generate_events(default_llamacpp, request))[-1]
    assert isinstance(done, Done) and done.stats.text == written
    assert done.stats.finish_reason == "stop" and done.stats.tool_calls == ()
    assert "could not be read" in done.stats.error
