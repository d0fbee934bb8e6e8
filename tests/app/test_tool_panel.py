"""The Tools panel on the real window (mock model): loading a tools.json, a bad one, the settings kept with the chat."""

from __future__ import annotations

import json

from engine import GenerationRequest

from app.state.database.store import Store
from app.state.tool_settings import MAX_RESULT_CHARS, ToolResult, load_chat_tools, save_tool_result, tool_results
from qt_helpers import send

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def _panel(w):
    return w.tools_dock.widget()


def test_a_tools_file_lists_its_tools_each_on_and_the_choice_names_them(window, tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": TOOLS}), encoding="utf-8")
    panel = _panel(window)
    assert panel.state.load_file(path)
    items = [panel.tool_list.item(i) for i in range(panel.tool_list.count())]
    assert [i.text() for i in items] == ["get_weather", "add"]
    assert items[0].toolTip() == "The weather in a city"
    choices = [panel.choice_box.itemData(i) for i in range(panel.choice_box.count())]
    assert choices == ["auto", "required", "none", "add", "get_weather"]
    items[1].setCheckState(items[1].checkState().Unchecked)  # the user turns "add" off
    settings = load_chat_tools(window.store, window.library.current.id)
    assert settings.enabled == {"get_weather"} and [t.name for t in settings.specs()] == ["get_weather"]
    assert "1 of 2 on" in panel.source_label.text()


def test_an_invalid_tools_file_is_one_line_naming_the_field_and_the_chat_still_works(qtbot, window, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(TOOLS), encoding="utf-8")
    panel = _panel(window)
    assert panel.state.load_file(good)
    panel.state.set_enabled("get_weather", False)
    panel.state.set_enabled("add", False)  # both off: the mock model has no tool format to answer with
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"type": "function", "function": {"name": "no spaces allowed"}}]), encoding="utf-8")
    assert not panel.state.load_file(bad)
    text = panel.error_label.text()
    assert "\n" not in text and text.startswith("bad.json: tools[0].function.name must be")
    assert panel.error_label.isVisibleTo(panel)
    assert [panel.tool_list.item(i).text() for i in range(panel.tool_list.count())] == ["get_weather", "add"]
    broken = tmp_path / "broken.json"
    broken.write_text("[{", encoding="utf-8")
    assert not panel.state.load_file(broken)
    assert panel.error_label.text().startswith("broken.json: not valid JSON (line 1")
    answer = send(qtbot, window, "hello")
    assert answer.content and answer.finish_reason in ("eos", "length") and "tools" not in answer.request


def test_the_chats_tool_settings_and_results_survive_reopening_the_database(qtbot, window, tmp_path, db_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS), encoding="utf-8")
    panel = _panel(window)
    assert panel.state.load_file(path)
    panel.state.set_choice("get_weather")
    panel.state.set_enabled("add", False)
    conv_id = window.library.current.id
    kept = save_tool_result(window.store, 7, "call_x", ToolResult("y" * (MAX_RESULT_CHARS + 5)))
    assert kept.truncated and kept.text.startswith("y" * MAX_RESULT_CHARS) and "cut" in kept.text
    reopened = Store(db_path)
    try:
        settings = load_chat_tools(reopened, conv_id)
        assert settings.choice == "get_weather" and settings.enabled == {"get_weather"}
        assert [d["function"]["name"] for d in settings.definitions] == ["get_weather", "add"]
        assert settings.source == str(path)
        assert tool_results(reopened, 7)["call_x"].truncated
    finally:
        reopened.close()
    other = window.library.new(system_prompt="another")  # another chat has its own tools (none)
    assert window.library.current is other and _panel(window).tool_list.count() == 0


def test_deleting_a_chat_deletes_its_tools_and_its_calls_results(tmp_path):
    """A chat's tools and its calls' results are settings rows of their own: deleting the chat left them behind."""
    from app.state.tool_settings import ChatTools, save_chat_tools

    store = Store(tmp_path / "db.sqlite")
    answers = {}
    kept, gone = store.create_conversation("kept"), store.create_conversation("gone")
    for conv in (kept, gone):
        answer = store.insert_message(conv.id, store.insert_message(conv.id, None, "user", "hi").id, "assistant", "x")
        save_chat_tools(store, conv.id, ChatTools(choice="required"))
        save_tool_result(store, answer.id, "call_1", ToolResult("18 C"))
        answers[conv.id] = answer.id
    store.delete_conversation(gone.id)
    keys = {r[0] for r in store._conn.execute("SELECT key FROM settings")}
    assert f"tools of chat {gone.id}" not in keys and f"tool results of message {answers[gone.id]}" not in keys
    assert load_chat_tools(store, kept.id).choice == "required"
    assert tool_results(store, answers[kept.id])["call_1"].text == "18 C"
    store.close()


def test_the_answer_length_is_fitted_to_the_context_the_tools_leave(default_llamacpp):
    """The window clamps an answer to the context left after the prompt; with tools the engine's prompt also holds
    their descriptions, which the count left out (a chat near the end of its context was refused instead)."""
    from types import SimpleNamespace

    from engine import tools

    from app.controllers.chat import ChatController
    from app.state.notebook import Prompt

    tok = default_llamacpp.tokenizer
    specs = tools.parse_tools([{"type": "function", "function": {
        "name": f"tool_{i}", "description": "A tool with a long description. " * 8,
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}} for i in range(6)])
    fields = {"tools": specs, "tool_choice": "auto"}
    prompt = Prompt(messages=({"role": "user", "content": "hi"},))
    plain = len(tok.chat_ids(list(prompt.messages), add_generation_prompt=True))
    with_tools = len(tools.prompt_ids_with_tools(tok, GenerationRequest(**prompt.request_fields(), **fields)))
    assert with_tools > plain + 300
    engine = SimpleNamespace(info=SimpleNamespace(context_length=with_tools + 50, runs_locally=True), tokenizer=tok)
    assert ChatController._fit_to_context(engine, prompt, 0, 4096, fields) == 50
    assert ChatController._fit_to_context(engine, prompt, 0, 4096) == with_tools + 50 - plain  # no tools: all of it
