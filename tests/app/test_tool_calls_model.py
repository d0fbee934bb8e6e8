"""Tool calls in the window on the default model (SmolLM2 GGUF on llama.cpp): a real, constrained call.

Under tool_choice "required" the constraint makes the call deterministic (greedy); the block must show the
model's own numbers (call_confidence over the same token records), the branch actions must make a new
version with the forced token, and a typed result must go back as a `tool` message and the model go on.
"""

from __future__ import annotations

import json

import pytest

from engine import call_confidence, tools

from app.controllers.engine_host import EngineHost
from app.state.tool_settings import tool_results
from app.widgets.tool_calls.tool_call_block import pct
from qt_helpers import answered, close_window, make_window, send

pytest.importorskip("llama_cpp")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                      "b": {"type": "number"}},
                                                     "required": ["a", "b"]}}},
]


def _panel(w):
    return w.tools_dock.widget()


@pytest.mark.slow
@pytest.mark.model
def test_a_real_call_shows_the_models_numbers_branches_and_continues_with_a_typed_result(qtbot, qloop, store, tmp_path):
    host = EngineHost()
    w = make_window(qtbot, store, host, max_new_tokens=60)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        assert task.result() is True
        w.settings.apply_preset("Greedy")
        path = tmp_path / "tools.json"
        path.write_text(json.dumps(TOOLS), encoding="utf-8")
        panel = _panel(w)
        assert panel.state.load_file(path)
        panel.state.set_choice("required")

        answer = send(qtbot, w, "What is the weather in Paris?", timeout_ms=120_000)
        conv = w.library.current
        assert answer.finish_reason == "tool_calls", answer.stats
        (call,) = [c for c in answer.stats["tool_calls"]]
        assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"]
        assert answer.request["tools"] == {"names": ["get_weather", "add"], "choice": "required"}

        # The block shows what call_confidence reads from the same token records.
        tokens = conv.tokens(answer)
        (expected,) = call_confidence(tokens, [tools.ToolCall(call["name"], call["arguments"], call["id"])],
                                      ["get_weather", "add"])
        area = w.chat.chat_view.widget_for(answer.id).tool_calls
        assert area.isVisible() and len(area.blocks) == 1
        block = area.blocks[0]
        d = expected.decision
        assert f"call: {pct(d.call_prob)} vs answering in text {pct(d.text_prob)}" in block.decision_label.text()
        mine = next(o for o in expected.name.options if o.name == "get_weather")
        assert f"the model's probability {pct(mine.model_prob)}" in block.name_label.text()
        assert f"share among the allowed names {pct(mine.share_of_allowed)}" in block.name_label.text()
        (arg,) = expected.arguments
        assert f"value {pct(arg.prob)} · weakest {arg.weakest.text!r} {pct(arg.weakest.prob)}" in \
            block.argument_labels["city"].text()
        assert repr(arg.alternatives[0].text) in block.argument_labels["city"].toolTip()

        # Other value: a branch at the value's first token with the model's alternative there.
        alt = block.value_buttons["city"].menu().actions()[0]
        alt.trigger()
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1] is not answer, timeout=120_000)
        branch = conv.path()[-1]
        assert branch.parent_id == answer.parent_id and branch.branch_index == arg.first.index
        forced = conv.tokens(branch)[arg.first.index]
        alts = [t for t in arg.alternatives if t.token_id != tokens[arg.first.index].token_id]
        assert forced.token_id == alts[0].token_id and forced.forced
        assert [t.token_id for t in conv.tokens(branch)[:arg.first.index]] == [t.token_id for t in tokens[:arg.first.index]]
        assert branch.stats["reused_tokens"] >= branch.stats["prompt_tokens"] - 1  # the chat's KV cache reused

        # Back to the first version; Answer instead: a branch at the decision token with a text token.
        conv.select_sibling(branch, -1)
        block = w.chat.chat_view.widget_for(answer.id).tool_calls.blocks[0]
        text_action = block.answer_button.menu().actions()[0]
        text_action.trigger()
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1] not in (answer, branch), timeout=120_000)
        instead = conv.path()[-1]
        assert instead.branch_index == d.token.index and instead.finish_reason != "tool_calls"
        assert conv.tokens(instead)[d.token.index].forced

        # Call another tool: a branch at the name token whose forced characters spell the other allowed tool;
        # the constraint then keeps that tool's own arguments.
        conv.select_sibling(instead, -2)
        block = w.chat.chat_view.widget_for(answer.id).tool_calls.blocks[0]
        (other_action,) = block.other_tool_button.menu().actions()
        assert other_action.text() == "add"
        other_action.trigger()
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1] not in (answer, branch, instead), timeout=120_000)
        other = conv.path()[-1]
        assert other.branch_index == expected.name.token.index and other.finish_reason == "tool_calls", other.stats
        (other_call,) = other.stats["tool_calls"]
        assert other_call["name"] == "add" and set(json.loads(other_call["arguments"])) == {"a", "b"}
        assert conv.tokens(other)[expected.name.token.index].forced

        # A typed result: Continue sends it as a tool message with the call's id; the model goes on.
        conv.select_sibling(other, -3)
        block = w.chat.chat_view.widget_for(answer.id).tool_calls.blocks[0]
        panel.state.set_choice("auto")
        block.result_edit.setPlainText("18 °C and <b>sunny</b>")
        block.continue_button.click()
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1].parent_id == answer.id, timeout=120_000)
        after = conv.path()[-1]
        assert tool_results(store, answer.id)[call["id"]].text == "18 °C and <b>sunny</b>"
        history = w.controller.tool_requests.last_history
        assert {"role": "tool", "tool_call_id": call["id"], "content": "18 °C and <b>sunny</b>"} in history
        assert after.content
        block = w.chat.chat_view.widget_for(answer.id).tool_calls.blocks[0]
        assert "<b>sunny</b>" in block.result_label.text()  # plain text: shown as written
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()
