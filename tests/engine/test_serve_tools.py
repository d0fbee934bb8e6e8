"""Tool calling through the server (issue 45 item 4), with the official `openai` client on 127.0.0.1.

The default model (SmolLM2, the built-in format and its constraint) runs a two-step tool loop: asked with
tools and tool_choice "required" it answers with a call in OpenAI's shape (`message.tool_calls`, content
null, finish_reason "tool_calls") whose arguments validate against the tool's schema (jsonschema); the
call and a `tool` message with its result go back in the history, and the model answers in text. Streamed:
`delta.tool_calls` with the id, type and name first, argument fragments after, then finish_reason
"tool_calls". Log-probs cover the call's tokens; the record keeps the call with the id the client got.
Bad tools, tool choices and tool history are 400s in words.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")
jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema")

from serve_helpers import served_default_model  # noqa: E402

pytestmark = [pytest.mark.model]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
RESULT = json.dumps({"city": "Paris", "temperature_c": 18, "sky": "cloudy"})


@pytest.fixture(scope="module")
def served():
    with served_default_model() as triple:
        yield triple


@pytest.fixture
def sink(served):
    served[2].clear()
    return served[2]


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1].url, api_key="not-needed", max_retries=0, timeout=120)


@pytest.fixture
def model(served):
    return served[0].info.name


def _valid(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


@pytest.mark.slow
def test_tool_loop_whole_call_then_text(client, model, sink, served):
    tokenizer = served[0].tokenizer
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=48, temperature=0,
                                           logprobs=True, top_logprobs=3)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in SCHEMAS
    _valid(call.function.name, call.function.arguments)
    # The log-probs cover every token of the answer, the call's included, with their alternatives.
    (ex,) = sink.wait_ends(1)
    events = ex.choices[0].events
    lps = choice.logprobs.content
    assert [t.token for t in lps] == [e.token_text for e in events] and len(lps) == first.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 for t in lps)
    assert {"opener", "name", "closer"} <= {e.tool_position for e in events}
    # The record keeps the call with the id the client got, and the finish reason it was told.
    assert ex.choices[0].stats.tool_calls[0].id == call.id and ex.choices[0].finish_reason == "tool_calls"

    # Step two: the call (the client's own message object, echoed back) and its result; the model answers in text.
    history = [*ASK, choice.message, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    second = client.chat.completions.create(model=model, messages=history, tools=[WEATHER, TIME], tool_choice="none",
                                            max_tokens=16, temperature=0)
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.tool_calls is None
    assert answer.message.content and "<tool_call>" not in answer.message.content
    _, ex2 = sink.wait_ends(2)
    prompt = tokenizer.decode(list(ex2.prompt_ids))
    # The prompt carried the earlier call and the result under the call's id (the built-in format).
    assert f'<tool_response id="{call.id}">' in prompt and "cloudy" in prompt and call.function.name in prompt
    assert "You can call these tools" not in prompt  # tool_choice "none": no definitions offered


@pytest.mark.slow
def test_tool_loop_streamed_deltas_then_text(client, model, sink):
    stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                            max_tokens=48, temperature=0, stream=True, logprobs=True)
    chunks = [c for c in stream if c.choices]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and all(d.index == 0 for d in deltas)
    head, rest = deltas[0], deltas[1:]
    assert head.id.startswith("call_") and head.type == "function" and head.function.name == "get_weather"
    assert rest and all(d.id is None and d.function.name is None for d in rest)  # fragments of the arguments
    arguments = "".join(d.function.arguments or "" for d in deltas)
    args = _valid("get_weather", arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)  # the answer is only the call
    (ex,) = sink.wait_ends(1)
    recorded = ex.choices[0].stats.tool_calls[0]
    assert recorded.id == head.id and recorded.parsed_arguments() == args
    # Every token's log-prob came, once, in order (those of the opener with the header's chunk, the closer's last).
    streamed = [t.token for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == [e.token_text for e in ex.choices[0].events]

    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": head.id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": head.id, "content": RESULT}]
    again = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], tool_choice="auto",
                                           max_tokens=16, temperature=0, stream=True)
    parts = [c for c in again if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in parts)
    assert text.strip() and not any(c.choices[0].delta.tool_calls for c in parts)
    assert parts[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
def test_named_tool_choice_forces_that_tool(client, model):
    named = {"type": "function", "function": {"name": "get_time"}}
    out = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice=named,
                                         max_tokens=40, temperature=0)
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name == "get_time"
    _valid("get_time", call.function.arguments)


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "get weather!", "parameters": {"type": "object"}}}]},
     "tools", "name must be 1 to 64 letters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools", "must describe an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "city"}}]},
     "tools", "must be a JSON-schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}] * 2},
     "tools", "names must be unique"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}]}, "tools", "cannot be followed"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "send_email"}}},
     "tool_choice", "not among the tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format", "cannot be combined"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]},
     "messages[1].tool_call_id", "no assistant message just before it made"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]}]},
     "messages[1].tool_calls[0].function.arguments", "must be JSON text"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "", "type": "function", "function": {
        "name": "get_weather", "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].id", "a call's id"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c1", "function": {
        "name": "x" * 65, "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].function.name", "1 to 64"),
    ({"messages": [*ASK, {"role": "assistant", "content": "x", "refusal": "no"}]}, "messages[1].refusal",
     "is not read here"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "c1", "content": "x", "extra": 1}]}, "messages[1]",
     "does not read"),
]


@pytest.mark.parametrize(("extra", "param", "words"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_tools_are_400s_in_words(client, model, extra, param, words):
    body = {"model": model, "messages": ASK, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError, match=words) as e:
        client.post("/chat/completions", body=body, cast_to=object)
    assert e.value.status_code == 400 and e.value.body["param"] == param
