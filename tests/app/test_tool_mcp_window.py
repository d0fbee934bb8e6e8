"""MCP in the window on the default model (llama.cpp) and a real MCP server (tests/mcp_server_fixture.py over
stdio): the servers listed with their tools, a call waiting for approval, Allow once running it and the model
answering on with its result, the choice shown; Deny told to the model; the step limit said in words."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.controllers.tool_loop import MAX_STEPS, STEP_LIMIT_TEXT
from app.controllers.engine_host import EngineHost
from app.state.tool_settings import tool_results
from qt_helpers import answered, close_window, make_window, run_task, send

pytest.importorskip("llama_cpp")
pytest.importorskip("mcp")

FIXTURE = Path(__file__).resolve().parents[1] / "mcp_server_fixture.py"


def _block(w, message):
    return w.chat.chat_view.widget_for(message.id).tool_calls.blocks[0]


@pytest.mark.slow
@pytest.mark.model
def test_an_mcp_call_waits_for_approval_runs_and_the_model_answers_on(qtbot, qloop, store, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"local": {"command": sys.executable, "args": [str(FIXTURE), "stdio"]},
                                                 "gone": {"command": str(tmp_path / "no-such-program")}}}))
    host = EngineHost()
    w = make_window(qtbot, store, host, max_new_tokens=40)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        assert task.result() is True
        w.settings.apply_preset("Greedy")
        panel = w.tools_dock.widget()
        assert run_task(qtbot, panel.mcp.load(config), timeout_ms=60_000)
        status = panel.extra.itemAt(0).widget().status_label.text()
        assert "local: running · " in status and " tools" in status
        assert "gone: not running:" in status
        panel.state.set_mcp_enabled("get_weather", True)
        panel.state.set_choice("required")
        answer = send(qtbot, w, "What is the weather in Paris?", timeout_ms=120_000)
        conv = w.library.current
        assert answer.finish_reason == "tool_calls"
        call = answer.stats["tool_calls"][0]
        assert call["name"] == "get_weather"
        block = _block(w, answer)
        assert block.approval is not None and block.approval.isVisibleTo(block)
        assert "get_weather" in block.approval.note.text() and "'local'" in block.approval.note.text()
        assert not tool_results(store, answer.id)  # nothing ran without approval

        panel.state.set_choice("auto")  # the next answer may answer in text
        w.settings.set_max_new_tokens(12)
        block.approval.allow_once.click()
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1].parent_id == answer.id, timeout=120_000)
        result = tool_results(store, answer.id)[call["id"]]
        city = json.loads(call["arguments"])["city"]
        expected = {"Paris": "18 C and sunny"}.get(city, f"no weather known for {city}")  # the fixture's table
        assert (result.source, result.approval, result.text, result.is_error) == ("mcp", "once", expected, False)
        assert {"role": "tool", "tool_call_id": call["id"], "content": result.text} in \
            w.controller.tool_requests.last_history
        shown = _block(w, answer).result_label.text()
        assert "from the tool · allowed once by you" in shown and result.text in shown

        # The step limit: the MAX_STEPS-th answer in a row with a call is not run, and says so.
        loop = panel.call_actions.loop
        parent = answer
        for _ in range(MAX_STEPS - 1):
            m = conv.add_message(parent, "assistant", "<tool_call>…</tool_call>")
            conv.update_message(m, finish_reason="tool_calls", stats={"tool_calls": [
                {"name": "get_weather", "arguments": '{"city": "Paris"}', "id": f"call_{m.id}"}]})
            parent = m
        loop._on_finished(parent, None)
        assert loop.steps(conv, parent) == MAX_STEPS
        assert loop.state[(parent.id, f"call_{parent.id}")] == "limit"
        assert not tool_results(store, parent.id)
        qtbot.waitUntil(lambda: conv.path()[-1] is parent and w.chat.chat_view.widget_for(parent.id) is not None)
        area = w.chat.chat_view.widget_for(parent.id).tool_calls
        assert area.blocks and area.blocks[0].approval.note.text() == STEP_LIMIT_TEXT

        # Deny: the model is told, the choice shown.
        w.settings.set_max_new_tokens(4)
        area.blocks[0].approval.deny.click()
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1].parent_id == parent.id, timeout=120_000)
        assert tool_results(store, parent.id)[f"call_{parent.id}"].approval == "denied"
        assert any(m.get("role") == "tool" and "denied" in m["content"] for m in w.controller.tool_requests.last_history)
        assert "denied by you" in w.chat.chat_view.widget_for(parent.id).tool_calls.blocks[0].result_label.text()
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()
