"""Function tools on /v1/responses and tool use on /v1/messages (issue 46 items 2 and 3), with the official
`openai` and `anthropic` clients against the server on 127.0.0.1 and the default model.

Each runs a two-step tool loop, whole and streamed: a forced tool choice makes the model answer with a call
(Responses: a `function_call` output item with call_id, name and arguments; Messages: a `tool_use` block with
id, name and input, stop_reason "tool_use") whose arguments validate against the tool's schema; the call and
its result go back (`function_call` + `function_call_output` items; `tool_use` + `tool_result` blocks) and the
model answers in text. Streamed, the call comes as Responses' `response.function_call_arguments.delta` /
`.done` events and Anthropic's `input_json_delta`s, and the record keeps the id the client got. One server
for the module.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")
anthropic = pytest.importorskip("anthropic", reason="needs the anthropic package (the test extra)")
jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema")

from serve_helpers import served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
                  "parameters": SCHEMA}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "The current weather in a city", "input_schema": SCHEMA}
ASK = "What is the weather in Paris right now?"
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
def oai(served):
    return openai.OpenAI(base_url=served[1].url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def claude(served):
    return anthropic.Anthropic(base_url=served[1].url.removesuffix("/v1"), api_key="unused", max_retries=0,
                               timeout=120)


def _prompt(served, exchange) -> str:
    return served[0].tokenizer.decode(list(exchange.prompt_ids))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_tool_loop(served, oai, sink, stream):
    model = served[0].info.name
    kw = dict(model=model, tools=[RESPONSES_TOOL], max_output_tokens=48, temperature=0)
    if stream:
        events = list(oai.responses.create(input=ASK, tool_choice="required", stream=True, **kw))
        kinds = [e.type for e in events]
        first = events[-1].response
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" not in kinds and deltas == done.arguments
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [i.type for i in added] == ["function_call"] and added[0].call_id
    else:
        first = oai.responses.create(input=ASK, tool_choice={"type": "function", "name": "get_weather"}, **kw)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), SCHEMA)
    if stream:
        assert call.arguments == deltas and call.call_id == added[0].call_id
    (ex,) = sink.wait_ends(1)
    assert ex.endpoint == "responses" and ex.choices[0].stats.tool_calls[0].id == call.call_id
    assert ex.choices[0].finish_reason == "tool_calls"

    # Step two: the call (the client's own output item, sent back) and its output; the model answers in text.
    history = [{"role": "user", "content": ASK}, call,
               {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    second = oai.responses.create(input=history, tool_choice="none", stream=stream, **{**kw, "max_output_tokens": 12})
    answer = list(second)[-1].response if stream else second
    assert [o.type for o in answer.output] == ["message"] and answer.output_text.strip()
    _, ex2 = sink.wait_ends(2)
    prompt = _prompt(served, ex2)
    assert call.call_id in prompt and "cloudy" in prompt and "get_weather" in prompt


def test_responses_previous_response_id_carries_the_call(served, oai, sink):
    """A stored response that was a call: its output item is kept, so only the call's output is sent next."""
    kw = dict(model=served[0].info.name, tools=[RESPONSES_TOOL], max_output_tokens=40, temperature=0)
    first = oai.responses.create(input=ASK, tool_choice="required", **kw)
    call = first.output[0]
    second = oai.responses.create(previous_response_id=first.id, tool_choice="none", input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}], **{**kw, "max_output_tokens": 12})
    assert second.output_text.strip() and second.previous_response_id == first.id
    _, ex2 = sink.wait_ends(2)
    assert call.call_id in _prompt(served, ex2) and "cloudy" in _prompt(served, ex2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_tool_loop(served, claude, sink, stream):
    kw = dict(model=served[0].info.name, max_tokens=48, tools=[ANTHROPIC_TOOL], extra_body={"temperature": 0})
    ask = [{"role": "user", "content": ASK}]
    if stream:
        with claude.messages.stream(messages=ask, tool_choice={"type": "any"}, **kw) as s:
            events = list(s)
            first = s.get_final_message()
        starts = [e.content_block for e in events if e.type == "content_block_start"]
        partial = "".join(e.delta.partial_json for e in events
                          if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        assert [b.type for b in starts] == ["tool_use"] and starts[0].id
        assert json.loads(partial) == first.content[0].input
    else:
        first = claude.messages.create(messages=ask, tool_choice={"type": "tool", "name": "get_weather"}, **kw)
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id
    jsonschema.validate(use.input, SCHEMA)
    (ex,) = sink.wait_ends(1)
    assert ex.endpoint == "messages" and ex.choices[0].stats.tool_calls[0].id == use.id

    history = [*ask, {"role": "assistant", "content": first.content},  # the SDK's blocks, sent back as they are
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    if stream:
        with claude.messages.stream(messages=history, tool_choice={"type": "none"}, **{**kw, "max_tokens": 12}) as s:
            answer = s.get_final_message()
    else:
        answer = claude.messages.create(messages=history, tool_choice={"type": "none"}, **{**kw, "max_tokens": 12})
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()
    assert answer.stop_reason in ("end_turn", "max_tokens")
    _, ex2 = sink.wait_ends(2)
    prompt = _prompt(served, ex2)
    assert use.id in prompt and "cloudy" in prompt


@pytest.mark.parametrize("api, body, param, words", [  # more in test_serve_responses_messages.py's refusals
    ("responses", {"input": "hi", "tools": [RESPONSES_TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice",
     "not supported here"),
    ("messages", {"max_tokens": 8, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "hi"}]},
     "tools.0.input_schema", "Field required"),
    ("messages", {"max_tokens": 8, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "nope"},
                  "messages": [{"role": "user", "content": "hi"}]}, "tool_choice", "not among the tools"),
])
def test_bad_tool_fields_are_400s_in_words(served, api, body, param, words):
    import httpx

    r = httpx.post(f"{served[1].url}/{api}", json={"model": served[0].info.name, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"]
    if api == "responses":
        assert err["param"] == param
