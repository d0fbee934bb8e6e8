"""The tool-call parsers on real-looking answers: each format's calls, and malformed ones left as text."""

from __future__ import annotations

import json

import pytest

from engine.tools.formats import format_of_rendered, parse_answer


def _calls(answer):
    return [(c.name, json.loads(c.arguments)) for c in answer.calls]


def test_hermes_block_with_newlines_as_qwen_writes_it():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    answer = parse_answer(text, "hermes")
    assert _calls(answer) == [("get_weather", {"city": "Paris"})]
    assert answer.content == "Let me check."
    assert answer.calls[0].id.startswith("call_") and len(answer.calls[0].id) == 29


def test_hermes_two_calls_and_arguments_as_json_text():
    text = ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    answer = parse_answer(text, "builtin")
    assert _calls(answer) == [("a", {"x": 1}), ("b", {})]
    assert answer.content == ""
    assert answer.calls[0].id != answer.calls[1].id


def test_hermes_unclosed_last_block_is_a_call_when_its_json_is_whole():
    assert _calls(parse_answer('<tool_call>{"name": "a", "arguments": {"x": [1, 2]}}', "hermes")) == [("a", {"x": [1, 2]})]


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',  # cut off
    '<tool_call>{"nam": "get_weather"}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "f", "arguments": {}} and more</tool_call>',  # text before the closer
    '<tool_call>' + "[" * 100_000,  # hostile nesting
    "<tool_call></tool_call>",
    "plain text answer",
])
def test_hermes_malformed_is_text(text):
    answer = parse_answer(text, "hermes")
    assert answer.calls == () and answer.content == text


def test_unknown_tool_name_is_text_when_names_are_given():
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_answer(text, "builtin", frozenset({"get_weather"})).calls == ()
    assert _calls(parse_answer(text, "builtin")) == [("rm_rf", {})]


def test_llama3_json_call_with_and_without_python_tag():
    assert _calls(parse_answer('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3")) == [
        ("get_weather", {"city": "Oslo"})]
    text = '<|python_tag|>{"name": "a", "parameters": {"n": 1}}; {"name": "b", "parameters": {}}'
    assert _calls(parse_answer(text, "llama3")) == [("a", {"n": 1}), ("b", {})]


@pytest.mark.parametrize("text", [
    'The answer is {"name": "a", "parameters": {}}',  # not the whole answer
    '{"name": "a", "parameters": {}} and then text',
    '{"city": "Oslo"}',
    '{"name": "a", "parameters": {"n": 1}',
])
def test_llama3_malformed_is_text(text):
    answer = parse_answer(text, "llama3")
    assert answer.calls == () and answer.content == text


def test_mistral_list_and_named_forms():
    text = 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "b", "arguments": {}}]'
    answer = parse_answer(text, "mistral")
    assert _calls(answer) == [("get_weather", {"city": "Rome"}), ("b", {})]
    assert answer.content == "Sure."
    assert _calls(parse_answer('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', "mistral")) == [
        ("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}',  # cut off
    "[TOOL_CALLS][]",
    '[TOOL_CALLS][{"arguments": {}}]',
    '[TOOL_CALLS]get_weather[ARGS]{"city": ',
    "no calls at all",
])
def test_mistral_malformed_is_text(text):
    answer = parse_answer(text, "mistral")
    assert answer.calls == () and answer.content == text


def test_format_is_told_from_the_rendered_prompt():
    assert format_of_rendered("same", "same") == "builtin"
    assert format_of_rendered("x <tool_call> y", "x") == "hermes"
    assert format_of_rendered("[AVAILABLE_TOOLS] ...", "x") == "mistral"
    assert format_of_rendered('respond with {"name": ..., "parameters": ...}', "x") == "llama3"
    assert format_of_rendered("some tools listed somehow", "x") == "builtin"
