"""The tool loop on the default model (SmolLM2 on llama.cpp) with a real MCP server over stdio: calls run only
as the approval callback says, results (or the denial) go back as `tool` messages, and the loop ends and says
why. SmolLM2 is weak, so the first answer is forced to a call (tool_choice required / named: the constraint
makes it well-formed) and the asserts are on the loop's structure, not on what the model says after."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from engine.decode.loop import generate_events
from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings
from engine.tools.mcp_config import parse_mcp_config
from engine.tools.mcp_hub import McpHub
from engine.tools.spec import ToolChoice, check_message
from engine.tools.tool_loop import DENIED, Approvals, run_tool_loop, step_from_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mcp_server_fixture import HERE, WEATHER  # noqa: E402

pytestmark = pytest.mark.slow
ASK = ({"role": "user", "content": "What is the weather in Paris?"},)


@pytest.fixture(scope="module")
def hub():
    config = parse_mcp_config({"mcpServers": {"fixture": {"command": sys.executable, "args": [str(HERE), "stdio"]}}})
    with McpHub() as hub:
        (status,) = hub.start(config)
        assert status.ok, status.error
        yield hub


@pytest.fixture
def loop_parts(hub, fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    tools = tuple(t for t in hub.tools() if t.name in ("get_weather", "add"))
    ran: list[tuple[str, dict]] = []
    asked: list[str] = []

    def generate(messages, choice):
        request = GenerationRequest(messages=messages, tools=tools, tool_choice=choice, max_new_tokens=36,
                                    sampler=SamplerSettings(seed=0, temperature=0.0))
        done = [e for e in generate_events(backend, request) if isinstance(e, Done)][-1]
        return step_from_stats(backend.tokenizer, request, done.stats)

    def call_tool(name, arguments):
        ran.append((name, arguments))
        return hub.call_tool(name, arguments)

    return tools, generate, call_tool, ran, asked


def _approver(asked, decision):
    def approve(call):
        asked.append(call.name)
        return decision
    return approve


def test_an_approved_call_runs_and_its_result_goes_back_as_a_tool_message(loop_parts):
    tools, generate, call_tool, ran, asked = loop_parts
    out = run_tool_loop(ASK, tools, generate, _approver(asked, "once"), call_tool,
                        first_choice=ToolChoice("named", "get_weather"), max_steps=2)
    assert asked[0] == "get_weather" and ran[0][0] == "get_weather"
    first = out.records[0]
    assert first.decision == "once" and first.result is not None and first.result.outcome == "ok"
    city = json.loads(first.call.arguments)["city"]
    assert first.result.text == WEATHER.get(city, f"no weather known for {city}")
    assistant, tool = out.messages[1], out.messages[2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == first.call.id
    assert tool == {"role": "tool", "tool_call_id": first.call.id, "content": first.result.text}
    for m in out.messages:
        check_message(m)  # every message is one the engine (and the server) takes back
    assert out.ended in ("answered", "step_limit") and out.steps <= 2 and out.reason
    if out.ended == "answered":
        assert out.messages[-1]["role"] == "assistant" and "answered in text" in out.reason
    else:
        assert "step limit (2 answers)" in out.reason


def test_a_denied_call_does_not_run_and_the_model_is_told(loop_parts):
    tools, generate, call_tool, ran, asked = loop_parts
    out = run_tool_loop(ASK, tools, generate, _approver(asked, "deny"), call_tool,
                        first_choice=ToolChoice("required"), max_steps=2, stop=lambda: True)
    assert ran == [] and asked and out.records[0].decision == "deny" and out.records[0].result is None
    assert (out.ended, out.steps, out.reason) == ("stopped", 1, "stopped by the user after 1 answers")
    assert out.messages[2] == {"role": "tool", "tool_call_id": out.records[0].call.id, "content": DENIED}


def test_always_is_asked_once_per_tool_across_loops(loop_parts):
    tools, generate, call_tool, ran, asked = loop_parts
    approvals = Approvals()
    for _ in range(2):
        run_tool_loop(ASK, tools, generate, _approver(asked, "always"), call_tool, max_steps=2, stop=lambda: True,
                      first_choice=ToolChoice("named", "get_weather"), approvals=approvals)
    assert asked == ["get_weather"] and [n for n, _ in ran] == ["get_weather", "get_weather"]
    assert "get_weather" in approvals.always


def test_the_step_limit_ends_the_loop_in_words_without_running_the_last_calls(loop_parts):
    tools, generate, call_tool, ran, asked = loop_parts
    out = run_tool_loop(ASK, tools, generate, _approver(asked, "once"), call_tool,
                        first_choice=ToolChoice("required"), max_steps=1)
    assert (out.ended, out.steps, ran, asked) == ("step_limit", 1, [], [])
    assert out.reason.startswith("stopped at the step limit (1 answers): the model was still calling tools (")
    assert out.messages == ASK and out.last is not None and out.last.calls
