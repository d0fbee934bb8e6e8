"""The server's tool-call stream deltas (engine.serve.tool_calls.ToolStream), fed token texts cut at awkward places.

No model: the model tests (test_serve_tools.py) show the deltas on real answers; these pin the cases a real
answer rarely hits: a call split mid-name and mid-key, braces inside argument strings, text that begins like
an opener and is not one, a call cut off before its name (sent as text, as the whole answer reads it).
"""

from __future__ import annotations

import json

import pytest

from engine.events import GenerationStats, TokenEvent
from engine.serve.tool_calls import ToolStream
from engine.tools import ToolCall, ToolChoice, ToolSpec
from engine.tools.render import ToolPlan

PLAN = ToolPlan((ToolSpec("get_weather", "", {"type": "object"}),), ToolChoice("auto"), "builtin", False)


def _event(i: int, text: str) -> TokenEvent:
    return TokenEvent(index=i, token_id=i, text=text, token_text=text, logprob=-0.1, sampler_logprob=-0.1, rank=0,
                      entropy=0.0, top_model=(), top_sampler=())


def _run(pieces: list[str], calls: tuple[ToolCall, ...] = ()) -> tuple[list[dict], list[list[str]], ToolStream]:
    stream = ToolStream(PLAN)
    deltas, lps = [], []
    for i, piece in enumerate(pieces):
        read = stream.feed(_event(i, piece), {"token": piece})
        if read is not None:
            deltas.append(read[0])
            lps.append([e["token"] for e in read[1]])
    rest, held = stream.finish(_stats(calls))
    deltas += rest
    lps.append([e["token"] for e in held])
    return deltas, lps, stream


def test_a_call_cut_anywhere_streams_header_then_the_arguments_text():
    pieces = [" <tool", "_call>{\"na", "me\": \"get_", "weather\", \"argu", "ments\": {\"q\": \"a}", "b{\\\"\", ",
              "\"n\": [1, {\"x\": 2}]", "}}</tool", "_call>"]
    call = ToolCall("get_weather", json.dumps({"q": 'a}b{"', "n": [1, {"x": 2}]}))
    deltas, lps, stream = _run(pieces, (call,))
    calls = [d["tool_calls"][0] for d in deltas]
    assert all("content" not in d for d in deltas)
    assert calls[0]["id"] == stream.call_id and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in c and "name" not in c["function"] for c in calls[1:])
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert arguments == '{"q": "a}b{\\"", "n": [1, {"x": 2}]}'  # the model's text, up to the object's own end
    assert json.loads(arguments) == call.parsed_arguments()
    assert sum(lps, []) == pieces  # every token's log-prob once, in order (the closer's at the end)
    assert lps[0] == pieces[:4]  # held until the header could go
    recorded = stream.recorded(_stats((call,)))
    assert recorded.tool_calls[0].id == stream.call_id and recorded.tool_calls[0].arguments == call.arguments


def _stats(calls: tuple[ToolCall, ...]) -> GenerationStats:
    return GenerationStats(finish_reason="tool_calls", prompt_tokens=1, reused_tokens=0, generated_tokens=9,
                           time_to_first_token_s=0.0, decode_tokens_per_s=0.0, total_s=0.0, peak_memory_bytes=0,
                           seed=0, text="", token_ids=(), tool_calls=calls)


def test_text_that_begins_like_an_opener_is_sent_as_content():
    pieces = ["<", "b>bold", "</b> and <tool_call> inside text"]
    deltas, lps, _ = _run(pieces)
    assert "".join(d["content"] for d in deltas) == "".join(pieces)
    assert lps[0] == ["<", "b>bold"] and sum(lps, []) == pieces


def test_a_call_cut_off_before_its_name_is_text_at_the_end():
    deltas, _, _ = _run(["<tool_call>", "{\"na"])
    assert deltas == [{"content": "<tool_call>{\"na"}]


def test_a_call_the_stream_did_not_see_is_sent_whole_at_the_end():
    call = ToolCall("get_weather", '{"city": "Oslo"}')
    deltas, _, _ = _run(["Sure: ", "I will call it"], (call,))
    assert deltas[-1] == {"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}


CALL_TEXTS = {  # each format's call as its grammar writes it (engine.tools.constraint)
    "builtin": '<tool_call>{"name": "get_weather", "arguments": {"q": "x\\"}", "n": [1, {"x": 2}]}}</tool_call>',
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"q": "x\\"}", "n": [1, {"x": 2}]}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"q": "x\\"}", "n": [1, {"x": 2}]}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"q": "x\\"}", "n": [1, {"x": 2}]}}]',
}


@pytest.mark.parametrize("fmt", sorted(CALL_TEXTS))
@pytest.mark.parametrize("width", [1, 2, 5, 9])
def test_every_format_cut_every_width_streams_the_name_then_exactly_the_arguments(fmt, width):
    text = CALL_TEXTS[fmt]
    pieces = [text[i:i + width] for i in range(0, len(text), width)]
    stream = ToolStream(ToolPlan(PLAN.tools, PLAN.choice, fmt, False))
    deltas = [d for d in (stream.feed(_event(i, p), None) for i, p in enumerate(pieces)) if d is not None]
    calls = [d[0]["tool_calls"][0] for d in deltas]
    assert all("content" not in d[0] for d in deltas)
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"] == stream.call_id
    assert "".join(c["function"]["arguments"] for c in calls) == '{"q": "x\\"}", "n": [1, {"x": 2}]}'
    assert stream.args_done  # the arguments ended where the call closes
