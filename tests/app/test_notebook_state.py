"""A notebook's state: its mode is saved (and an old database opens as chats), edits keep every version,
its prompt is its raw text, and it is exported and recovered as a notebook."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app.state.notebook import Prompt, apply_text, notebook_text, prompt_for, spans
from app.state.export import to_json_dict, to_markdown
from app.state.conversation_list import Library
from app.state.database.recovery import open_database
from app.state.database.store import REPAIR_MARKER_SUFFIX, SCHEMA, SCHEMA_VERSION, Store

# The conversations table as version 1 of the database wrote it (no mode column).
V1_CONVERSATIONS = """CREATE TABLE conversations (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL, active_root_id INTEGER)"""


def _v1_database(path) -> None:
    conn = sqlite3.connect(path)
    conn.execute(V1_CONVERSATIONS)
    for statement in filter(str.strip, SCHEMA.split(";")):
        if "TABLE IF NOT EXISTS conversations" not in statement:
            conn.execute(statement)
    conn.execute("INSERT INTO conversations(title, system_prompt, created, updated) VALUES ('old chat', '', 1, 1)")
    conn.execute("INSERT INTO messages(conversation_id, parent_id, role, content, created) VALUES (1, NULL, 'user', 'hi', 1)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def test_a_version_1_database_opens_with_its_conversations_as_chats(tmp_path):
    path = tmp_path / "old.sqlite3"
    _v1_database(path)
    store = Store(path)
    try:
        (row,) = store.conversations()
        assert row.title == "old chat" and row.mode == "chat"
        assert [m.content for m in store.messages(row.id)] == ["hi"]
        notebook = store.create_conversation("n", mode="notebook")
        assert store.conversation(notebook.id).mode == "notebook"
    finally:
        store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2


def test_the_mode_is_saved_and_only_an_empty_conversation_changes_it(tmp_path):
    path = tmp_path / "db.sqlite3"
    store = Store(path)
    lib = Library(store)
    conv = lib.new(mode="notebook")
    assert conv.mode == "notebook"
    apply_text(conv, "Once upon a time")
    with pytest.raises(ValueError, match="only an empty conversation"):
        conv.set_mode("chat")
    store.close()
    again = Library(Store(path)).open(conv.id)
    assert again.mode == "notebook" and notebook_text(again) == "Once upon a time"
    with pytest.raises(ValueError, match="chat or a notebook"):
        again._store.create_conversation("x", mode="poem")


def test_an_empty_chat_becomes_the_new_notebook_and_back():
    lib = Library(Store(":memory:"))
    chat = lib.new()
    shown = []
    lib.current_changed.connect(shown.append)
    notebook = lib.new(mode="notebook")
    assert notebook is chat and chat.mode == "notebook" and shown == [chat]
    assert notebook.title == "New notebook"  # an untitled notebook says what it is
    assert [r.title for r in lib.summaries()] == ["New notebook"]
    back = lib.new()
    assert back.mode == "chat" and back.title == "New chat"
    back.set_title("Sea poems")
    lib.new(mode="notebook")
    assert back.title == "Sea poems"  # a title the user gave is kept
    lib.rename(back.id, "   ")
    assert back.title == "New notebook"  # cleared: the untitled name of its mode


def test_a_new_notebook_is_titled_so_and_the_sidebar_marks_it(qtbot, tmp_path):
    from app.widgets.chat.sidebar import Sidebar

    lib = Library(Store(":memory:"))
    lib.new(mode="notebook")
    apply_text(lib.current, "Once upon a time")
    lib.new()
    sidebar = Sidebar(lib)
    qtbot.addWidget(sidebar)
    items = {sidebar.list.item(i).text(): sidebar.list.item(i) for i in range(sidebar.list.count())}
    assert set(items) == {"New chat", "Once upon a time"}
    assert items["Once upon a time"].font().italic() and "notebook" in items["Once upon a time"].toolTip()
    assert not items["New chat"].font().italic() and "chat" in items["New chat"].toolTip()


def _generated(conv, parent, text):
    """A generated part (no tokens needed for the text logic)."""
    part = conv.add_message(parent, "assistant", text)
    conv.update_message(part, finish_reason="stop")
    return part


def test_edits_keep_every_version_and_the_prompt_is_the_text_before_a_part():
    lib = Library(Store(":memory:"))
    conv = lib.new(mode="notebook")
    typed = apply_text(conv, "The cat")
    assert apply_text(conv, "The cat sat") is typed and typed.content == "The cat sat"  # grows in place
    gen = _generated(conv, typed, " on the mat.")
    assert notebook_text(conv) == "The cat sat on the mat."
    assert prompt_for(conv, typed) == Prompt(text="The cat sat")
    assert apply_text(conv, "The cat sat on the mat.") is gen  # nothing changed

    more = apply_text(conv, "The cat sat on the mat. Then")  # after a generated part: a new typed part
    assert more.parent_id == gen.id and more.content == " Then"
    assert prompt_for(conv, more).text == "The cat sat on the mat. Then"

    edited = apply_text(conv, "The cat sat on the rug. Then")  # an edit inside the generated part
    assert edited.parent_id == typed.id and edited.content == " on the rug. Then"
    assert conv.siblings(edited) == [gen, edited] and gen.content == " on the mat."  # the old one is kept
    assert notebook_text(conv) == "The cat sat on the rug. Then"
    assert [(m.id, at) for m, at in spans(conv)] == [(typed.id, 0), (edited.id, len("The cat sat"))]
    conv.select_sibling(edited, -1)
    assert notebook_text(conv) == "The cat sat on the mat. Then"


def test_a_chat_prompt_is_still_its_messages():
    lib = Library(Store(":memory:"))
    conv = lib.new()
    user = conv.add_message(None, "user", "hi")
    assert prompt_for(conv, user).request_fields() == {"messages": ({"role": "user", "content": "hi"},)}


def test_a_notebook_is_exported_as_its_text_and_as_json_with_its_mode():
    lib = Library(Store(":memory:"))
    conv = lib.new(mode="notebook")
    typed = apply_text(conv, "Roses are red,\n")
    part = _generated(conv, typed, "violets are blue.")
    conv.update_message(part, model={"name": "SmolLM2"})
    md = to_markdown(conv)
    assert "Roses are red,\nviolets are blue." in md and "User:" not in md and "## Assistant" not in md
    assert "written by SmolLM2" in md
    doc = json.loads(json.dumps(to_json_dict(conv)))
    assert doc["mode"] == "notebook"
    assert "".join(m["content"] for m in doc["messages"] if m["id"] in doc["active_path"]) == "Roses are red,\nviolets are blue."


def test_a_recovered_database_keeps_its_notebooks(data_dir):
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "logitlab.sqlite3"
    store = Store(path)
    lib = Library(store)
    apply_text(lib.new(mode="notebook"), "kept as a notebook")
    store.close()
    (data_dir / ("logitlab.sqlite3" + REPAIR_MARKER_SUFFIX)).write_text("test damage\n")
    opened = open_database(path)
    try:
        assert opened.notice is not None and opened.notice.kind == "recovered"
        (row,) = opened.store.conversations()
        assert row.mode == "notebook"
    finally:
        opened.store.close()
