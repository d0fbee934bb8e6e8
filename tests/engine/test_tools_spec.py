"""Tools and tool_choice on a GenerationRequest: checked in words; the built-in prompt; the grammar; the tracker."""

from __future__ import annotations

import json

import pytest

from engine.constraints.spec import Constraint
from engine.request import GenerationRequest
from engine.tools.constraint import tool_grammar
from engine.tools.render import ToolPlan, builtin_block, builtin_messages
from engine.tools.spec import ToolChoice, ToolSpec, ToolSpecError, parse_tools
from engine.tools.tracker import CallTracker

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}
HI = ({"role": "user", "content": "Hi"},)


def test_request_takes_openai_tools_and_choices():
    r = GenerationRequest(messages=HI, tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}})
    assert [t.name for t in r.tools] == ["get_weather", "add"]
    assert r.tool_choice == ToolChoice("named", "add")
    assert GenerationRequest(messages=HI, tools=[WEATHER], tool_choice="required").tool_choice_spec.forced
    assert not GenerationRequest(messages=HI, tools=[WEATHER], tool_choice="none").tool_choice_spec.calls


@pytest.mark.parametrize("tools, choice, words", [
    ([WEATHER, WEATHER], "auto", "two tools are named 'get_weather'"),
    ([{"name": "get weather!"}], "auto", "1 to 64 letters"),
    ([{"name": "x" * 65}], "auto", "1 to 64 letters"),
    ([{"name": "f", "parameters": {"type": "array"}}], "auto", "must describe an object"),
    ([{"name": "f", "parameters": "{}"}], "auto", "JSON-schema object"),
    ([{"name": "f", "parameters": {"type": "object", "required": "city"}}], "auto", "required of tool 'f'"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "auto", 'type must be "function"'),
    ([{"name": f"t{i}"} for i in range(200)], "auto", "at most 128"),
    ([{"name": "f", "parameters": {"type": "object", "description": "x" * 20_000}}], "auto", "at most 16,000"),
    ([WEATHER], "lookup", "not among the tools (get_weather)"),
    ([], "required", "needs at least one tool"),
    ("get_weather", "auto", "must be a list of tools"),
])
def test_bad_tools_are_refused_in_words(tools, choice, words):
    with pytest.raises(ToolSpecError, match=None) as e:
        GenerationRequest(messages=HI, tools=tools, tool_choice=choice)
    assert words in str(e.value)


def test_tools_with_a_response_format_are_refused():
    with pytest.raises(ToolSpecError, match="cannot be combined"):
        GenerationRequest(messages=HI, tools=[WEATHER], constraint=Constraint.any_json())
    GenerationRequest(messages=HI, tools=[WEATHER], tool_choice="none", constraint=Constraint.any_json())


def test_history_messages_with_calls_and_results_are_checked():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    r = GenerationRequest(messages=(*HI, {"role": "assistant", "content": None, "tool_calls": [call]},
                                    {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}), tools=[WEATHER])
    assert r.messages[1]["content"] == "" and r.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    with pytest.raises(ValueError, match="tool_call_id"):
        GenerationRequest(messages=(*HI, {"role": "tool", "content": "12 C"}))
    with pytest.raises(ValueError, match="only an assistant message"):
        GenerationRequest(messages=({"role": "user", "content": "x", "tool_calls": [call]},))


def test_builtin_messages_carry_tools_calls_and_results():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "system", "content": "Be brief."}, *HI, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "rain"}]
    out = builtin_messages(messages, parse_tools([WEATHER]), ToolChoice("required"))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call these tools")
    assert '{"name":"get_weather",' in out[0]["content"] and "You must call one of the tools" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert out[3]["content"] == ('<tool_response id="call_1">\n12 C\n</tool_response>\n'
                                 '<tool_response id="call_2">\nrain\n</tool_response>')
    assert all(set(m) == {"role", "content"} for m in out)


def test_builtin_block_lists_each_tool_as_one_line_of_compact_json():
    # Every decode step attends over this block, so it is short: compact JSON, no top-level "type": "object"
    # (every tool's parameters are an object), no empty description; the rest of the schema as given.
    block = builtin_block(parse_tools([WEATHER, ADD]), ToolChoice("auto"))
    lines = block.splitlines()
    assert lines[0] == "You can call these tools:"
    assert lines[1] == ('{"name":"get_weather","description":"Weather in a city",'
                        '"parameters":{"properties":{"city":{"type":"string"}},"required":["city"]}}')
    assert lines[2] == '{"name":"add","parameters":{"properties":{"a":{"type":"number"}}}}'
    assert json.loads(lines[1])["parameters"] == {k: v for k, v in WEATHER["function"]["parameters"].items()
                                                  if k != "type"}
    # How to call, in the shape the grammar forces, and what the choice asks.
    assert ('<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>' in lines[3]
            and "matching its parameters" in lines[3])
    assert lines[4].startswith("If no tool fits, answer in plain text.") and "<tool_response>" in lines[4]
    assert len(lines) == 5
    named = builtin_block(parse_tools([WEATHER]), ToolChoice("named", "get_weather"))
    assert 'You must call the tool "get_weather" now.' in named
    # A schema without "type" (the object is the default) and with other top-level keys keeps them all.
    free = parse_tools([{"name": "f", "description": "d",
                         "parameters": {"properties": {}, "additionalProperties": True}}])
    assert '"parameters":{"properties":{},"additionalProperties":true}' in builtin_block(free, ToolChoice("auto"))


def _walk(grammar: str, text: str) -> tuple[int, bool]:
    """How many bytes of `text` the grammar takes, and whether it may end there."""
    from llguidance import LLMatcher

    from engine.constraints.vocabulary import byte_tokenizer

    m = LLMatcher(byte_tokenizer(), Constraint.lark(grammar).grammar, log_level=0)
    raw = list(text.encode())
    n = m.try_consume_tokens(raw)
    return n, bool(m.is_accepting()) and n == len(raw)


def test_grammar_allows_text_or_a_valid_call_as_the_choice_says():
    tools = parse_tools([WEATHER, ADD])
    auto = tool_grammar(ToolPlan(tools, ToolChoice("auto"), "builtin", False))
    required = tool_grammar(ToolPlan(tools, ToolChoice("required"), "builtin", False))
    named = tool_grammar(ToolPlan(tools, ToolChoice("named", "add"), "builtin", False))
    assert auto and required and named
    good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert _walk(auto, "It is sunny.")[1] and _walk(auto, good)[1] and _walk(required, good)[1]
    assert not _walk(required, "It is sunny.")[1]
    assert not _walk(named, good)[1] and _walk(named, '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')[1]
    # Arguments that break the schema (a number for a string, a missing required one, an extra one) are refused.
    for bad in ('{"city": 3}', "{}", '{"city": "Oslo", "units": "C"}'):
        assert not _walk(required, f'<tool_call>{{"name": "get_weather", "arguments": {bad}}}</tool_call>')[1]
    assert not _walk(auto, ' <tool_call>{"name": "nope"')[1]  # a broken call is not text either
    # ...nor a call after a sentence (SmolLM2 wrote one, copying the prompt's placeholder; it was read as text)
    assert not _walk(auto, "I will check. " + good)[1] and _walk(auto, "A <b>bold</b> {json} answer.")[1]
    # The arguments are written as templates write them (`, ` and `: `, no other whitespace): SmolLM2 at
    # temperature 0 spaced a call's `{}` with newlines and spaces, even bounded as llama.cpp bounds JSON's,
    # and ran out of length inside the call.
    def call(args: str) -> str:
        return f'<tool_call>{{"name": "get_weather", "arguments": {args}}}</tool_call>'
    for spaced in ('{\n  "city": "Oslo"\n}', '{ "city": "Oslo" }', '{"city":"Oslo"}', '{"city":  "Oslo"}'):
        assert not _walk(required, call(spaced))[1], spaced
    empty = tool_grammar(ToolPlan(parse_tools([{"name": "now", "parameters": {"type": "object", "properties": {}}},
                                               {"name": "tags", "parameters": {"type": "object", "properties": {
                                                   "t": {"type": "array", "items": {"type": "integer"}}}}}]),
                                  ToolChoice("required"), "builtin", False))
    assert empty and _walk(empty, '<tool_call>{"name": "now", "arguments": {}}</tool_call>')[1]
    assert _walk(empty, '<tool_call>{"name": "now", "arguments": {')[0] == len('<tool_call>{"name": "now", "arguments": {')
    assert _walk(empty, '<tool_call>{"name": "now", "arguments": {\n')[0] < len('<tool_call>{"name": "now", "arguments": {\n')
    assert _walk(empty, '<tool_call>{"name": "tags", "arguments": {"t": [1, 2]}}</tool_call>')[1]
    assert not _walk(empty, '<tool_call>{"name": "tags", "arguments": {"t": [1,2]}}</tool_call>')[1]
    # A tool that sets llguidance's JSON options itself keeps them.
    own = tool_grammar(ToolPlan(parse_tools([{"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "x-guidance": {"whitespace_flexible": True}}}]),
        ToolChoice("required"), "builtin", False))
    assert own and _walk(own, '<tool_call>{"name": "f", "arguments": {\n "a" :1}}</tool_call>')[1]
    assert tool_grammar(ToolPlan(tools, ToolChoice("none"), "builtin", False)) is None


def test_tracker_positions_a_streamed_call_and_sees_it_complete():
    t = CallTracker("builtin")
    pieces = ["<tool", "_call>", '{"', 'name', '": "', "get", "_weather", '", "', "arguments", '": {"', "city",
              '": "', "Os", "lo", '", "', "days", '": [', "1", ", ", "2", "]}}", "</tool", "_call>"]
    seen = [t.feed(p) for p in pieces]
    assert seen[:4] == ["opener"] * 4
    assert seen[5:7] == ["name", "name"]
    assert seen[12:14] == ["arguments.city", "arguments.city"]
    assert seen[17] == "arguments.days[0]" and seen[19] == "arguments.days[1]"
    assert seen[-2:] == ["closer", "closer"]
    assert [t.complete] == [True]
    text = CallTracker("builtin")
    assert [text.feed(p) for p in ["Hello", " there"]] == [None, None] and not text.complete


def test_tracker_follows_hermes_calls_with_newlines_around_the_json():
    t = CallTracker("hermes")
    pieces = ["<tool_call>", "\n", '{"name": "', "add", '", "arguments": {', '"a": ', "1", "}}", "\n", "</tool_call>"]
    seen = [t.feed(p) for p in pieces]
    assert seen[0] == "opener" and seen[3] == "name" and seen[6] == "arguments.a" and seen[-2:] == ["closer", "closer"]
    assert t.complete


def test_llama3_and_mistral_calls_are_followed_too():
    llama = CallTracker("llama3")
    seen = [llama.feed(p) for p in ['{"name": "', "add", '", "parameters": {"a": ', "1", "}}"]]
    # A token's position is its first character's: the quote that closes the name is the name's.
    assert seen == ["opener", "name", "name", "arguments.a", "arguments"] and llama.complete
    tagged = CallTracker("llama3")
    assert tagged.feed("<|python_tag|>") == "opener" and tagged.feed('{"name"') == "opener" and not tagged.complete
    assert CallTracker("llama3").feed("Sure, {") is None  # text first: a brace later is not a call
    mistral = CallTracker("mistral")
    seen = [mistral.feed(p) for p in ["[TOOL_CALLS]", '[{"name": "', "add", '", "arguments": {"a": ', '"x"', "}}", "]"]]
    assert seen == ["opener", "opener", "name", "name", "arguments.a", "arguments", "closer"] and mistral.complete


def test_llama3_grammar_writes_the_bare_json_call():
    tools = parse_tools([WEATHER])
    required = tool_grammar(ToolPlan(tools, ToolChoice("required"), "llama3", True))
    auto = tool_grammar(ToolPlan(tools, ToolChoice("auto"), "llama3", True))
    assert required and auto
    assert _walk(required, '{"name": "get_weather", "parameters": {"city": "Oslo"}}')[1]
    assert not _walk(required, '{"name": "get_weather", "arguments": {"city": "Oslo"}}')[1]
    assert _walk(auto, "It is cold in Oslo.")[1] and not _walk(auto, '{"city": "Oslo"}')[1]
