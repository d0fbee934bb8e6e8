"""What the model decided in a tool call (engine/tools/confidence.py), checked against the answer's own token
records on the default model (SmolLM2-135M on llama.cpp, the built-in call format, the constraint on), and
`logitlab-cli generate/chat --tools FILE [--tool-choice ...]` with its hostile inputs.

The oracle is the records themselves: each expected number is summed or multiplied here from the TokenEvents
(`tool_position`, `logprob`, `top_model`), not taken from the function under test. The two tools' names begin
with different letters, so the token where the name is chosen is the first one that writes a letter of it.
"""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import pytest

from cli_checks import one_error_line, refuse_model_load, run_cli
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings
from engine.tools.confidence import call_confidence

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                      "required": ["a", "b"]}}}
NAMES = ["get_weather", "add"]
OPENER = "<tool_call>"


def _answer(backend, messages, choice, seed):
    request = GenerationRequest(messages=messages, tools=[WEATHER, ADD], tool_choice=choice, max_new_tokens=40,
                                top_n=20, sampler=SamplerSettings(seed=seed, temperature=1.0))
    events = list(generate_events(backend, request))
    done = events[-1]
    assert isinstance(done, Done) and done.stats.finish_reason == "tool_calls", done.stats.text
    return [e for e in events if isinstance(e, TokenEvent)], done.stats.tool_calls


def _listed(e: TokenEvent):
    """The listed alternatives at `e`, the taken token added when it is not among them (its log-prob is known)."""
    alts = [(t.text, t.prob) for t in e.top_model if not t.is_rest]
    if all(t.token_id != e.token_id for t in e.top_model):
        alts.append((e.token_text, e.prob))
    return alts


def _check_against_records(events, calls, allowed):
    (call,) = calls
    (conf,) = call_confidence(events, calls, allowed)
    assert conf.call == call
    # (a) Calling at all: the opener's first token, its probability and the listed tokens that begin the opener.
    opener = [e for e in events if e.tool_position == "opener"]
    d = conf.decision
    assert d is not None and d.token.index == opener[0].index
    assert d.token.prob == pytest.approx(opener[0].prob)
    expected_call = sum(p for text, p in _listed(opener[0]) if text.lstrip() and OPENER.startswith(text.lstrip()))
    assert d.call_prob == pytest.approx(expected_call) and d.call_prob >= d.token.prob * (1 - 1e-9)
    assert d.opener_prob == pytest.approx(math.exp(sum(e.logprob for e in opener)))
    assert d.text_prob == pytest.approx(1 - expected_call)
    assert d.alternatives == opener[0].top_model
    # (b) The name: at the first name token that writes a letter of it, each allowed name's model probability is
    # the sum of the listed tokens there that begin it; the share inside the allowed names sums to 1.
    name_tokens = [e for e in events if e.tool_position == "name"]
    at = next(e for e in name_tokens if e.token_text.strip(' "'))
    n = conf.name
    assert n is not None and n.token.index == at.index and n.chosen == call.name
    assert {o.name for o in n.options} == set(allowed)
    for o in n.options:
        expected = sum(p for text, p in _listed(at) if text.strip(' "') and o.name.startswith(text.strip(' "')))
        assert o.model_prob == pytest.approx(expected), o
        assert o.listed == (expected > 0)
    chosen = next(o for o in n.options if o.name == call.name)
    assert chosen.model_prob >= at.prob * (1 - 1e-9)  # the taken token leads to the chosen name
    assert sum(o.share_of_allowed for o in n.options) == pytest.approx(1.0)
    assert n.written_prob == pytest.approx(math.exp(sum(e.logprob for e in name_tokens)))
    # (c) Each argument: exp(sum of its tokens' log-probs), its weakest token, the alternatives where its value begins.
    args = call.parsed_arguments()
    assert [a.name for a in conf.arguments] == list(args)
    for a in conf.arguments:
        mine = [e for e in events if e.tool_position == f"arguments.{a.name}"]
        assert mine and [t.index for t in a.tokens] == [e.index for e in mine]
        assert a.prob == pytest.approx(math.exp(sum(e.logprob for e in mine)))
        weakest = min(mine, key=lambda e: e.logprob)
        assert (a.weakest.index, a.weakest.text) == (weakest.index, weakest.token_text)
        assert a.weakest.prob == pytest.approx(weakest.prob)
        first = next(e for e in mine if e.token_text.strip(' :"'))
        assert a.first.index == first.index and a.alternatives == first.top_model
        assert json.loads(a.value) == args[a.name]
    text = conf.describe()
    assert f"call {call.name}(" in text and "share inside the allowed names (renormalised, not the model's p)" in text
    return conf


@pytest.mark.slow
def test_confidence_of_a_required_call_matches_the_token_records(default_llamacpp):
    ask = ({"role": "user", "content": "What is the weather in Paris?"},)
    for seed in (1, 2):
        events, calls = _answer(default_llamacpp, ask, "required", seed)
        _check_against_records(events, calls, NAMES)
        # Under a millisecond of CPU per call (process time: the machine may be busy with other work).
        start, rounds = time.process_time(), 200
        for _ in range(rounds):
            call_confidence(events, calls, NAMES)
        per_call_ms = (time.process_time() - start) / rounds * 1000
        assert per_call_ms < 1.0, per_call_ms


@pytest.mark.slow
def test_confidence_of_a_named_call_has_one_allowed_name(default_llamacpp):
    ask = ({"role": "user", "content": "Add 2 and 3."},)
    events, calls = _answer(default_llamacpp, ask, {"type": "function", "function": {"name": "add"}}, 3)
    assert calls[0].name == "add"
    conf = _check_against_records(events, calls, ["add"])
    assert conf.name is not None and [o.share_of_allowed for o in conf.name.options] == [1.0]
    assert {a.name for a in conf.arguments} == {"a", "b"}


# --- the command line ------------------------------------------------------------------------------------------


@pytest.fixture
def tools_file(tmp_path) -> Path:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([WEATHER, ADD]), encoding="utf-8")
    return path


@pytest.mark.slow
def test_cli_generate_with_tools_prints_the_call_and_its_confidence(tools_file, capsys):
    code = run_cli(["generate", "--tools", str(tools_file), "--tool-choice", "required", "-p",
                    "What is the weather in Paris?", "-n", "40", "-s", "1", "-t", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "<tool_call>" in out
    lines = out.splitlines()
    call_line = next(ln for ln in lines if ln.startswith("call "))
    assert call_line.split("(")[0].removeprefix("call ") in NAMES
    assert any(ln.strip().startswith("call vs text: p(call)=") for ln in lines)
    assert any(ln.strip().startswith("tool name at token") and "model p:" in ln for ln in lines)
    assert any("share inside the allowed names" in ln for ln in lines)
    assert any(ln.strip().startswith("argument ") and "weakest" in ln for ln in lines)


@pytest.mark.slow
def test_cli_chat_with_a_named_tool_prints_each_call(tools_file, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Add 2 and 3.\n/quit\n"))
    code = run_cli(["chat", "--tools", str(tools_file), "--tool-choice", "add", "-n", "40", "-s", "1", "-t", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert any(ln.startswith("call add(") for ln in out.splitlines()), out
    assert "argument a = " in out and "argument b = " in out


def _schema_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tools.json"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("make, extra, needle", [
    (lambda d: str(d / "missing.json"), [], "no such file"),
    (lambda d: _schema_file(d, '[{"type": "function", "function": {"name": "x",'), [], "not valid JSON"),
    (lambda d: _schema_file(d, '{"name": "x"}'), [], "must hold a JSON list of tools"),
    (lambda d: _schema_file(d, "[]"), [], "the list of tools is empty"),
    (lambda d: _schema_file(d, '[{"type": "function", "function": {"name": "get weather"}}]'), [],
     "tools[0].function.name"),
    (lambda d: _schema_file(d, '[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]'),
     [], "tools[0].function.parameters"),
    (lambda d: _schema_file(d, json.dumps([WEATHER, WEATHER])), [], "two tools are named 'get_weather'"),
    (lambda d: _schema_file(d, json.dumps([WEATHER])), ["--tool-choice", "add"], "--tool-choice add"),
    (lambda d: None, ["--tool-choice", "required"], "--tool-choice needs --tools"),
])
def test_cli_tools_hostile_inputs_are_one_line_before_the_model_loads(command, make, extra, needle, tmp_path,
                                                                      capsys, monkeypatch):
    refuse_model_load(monkeypatch)
    path = make(tmp_path)
    argv = [command, *(["--tools", path] if path else []), *extra, *(["-p", "hi"] if command == "generate" else [])]
    assert run_cli(argv) == 2
    line = one_error_line(capsys)
    assert needle in line and (path is None or "--tools" in line or "--tool-choice" in line), line


def test_cli_tools_with_a_constraint_is_refused_before_the_model_loads(tools_file, capsys, monkeypatch):
    refuse_model_load(monkeypatch)
    assert run_cli(["generate", "--tools", str(tools_file), "--regex", "[a-z]+", "-p", "hi"]) == 2
    assert "--tools cannot be combined with --json-schema, --grammar or --regex" in one_error_line(capsys)
