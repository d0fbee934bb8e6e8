"""Attachments kept with the conversation: content-addressed rows (one per file's bytes, shared by branches and
edits), read back with the chat, exported, dropped with the last conversation that links them; a version-3
database (before attachments) opens with its chats intact."""

from __future__ import annotations

import json
import sqlite3

from app.state.conversation import Conversation
from app.state.export import to_json, to_markdown
from app.state.database.store import SCHEMA, SCHEMA_VERSION, Store
from engine.documents import attachment_from_bytes, compose_message

NOTES = attachment_from_bytes("notes.md", b"# Notes\n\nThe meeting is on Tuesday.\n")
TABLE = attachment_from_bytes("table.csv", b"a,b\n1,2\n")


def _open(store: Store, conversation_id: int) -> Conversation:
    row = store.conversation(conversation_id)
    assert row is not None
    return Conversation(store, row, store.messages(conversation_id))


def _links(store: Store) -> int:
    return int(store._conn.execute("SELECT COUNT(*) FROM message_attachments").fetchone()[0])


def test_attachments_are_stored_once_across_an_edit_and_read_back_with_the_chat(tmp_path):
    path = tmp_path / "db.sqlite3"
    store = Store(path)
    conv = _open(store, store.create_conversation("c").id)
    first = conv.add_message(None, "user", "When is it?", attachments=[NOTES, TABLE])
    conv.add_message(first, "assistant", "Tuesday.")
    # An edit of the question is a sibling: the same files, linked again, not stored again.
    edited = conv.add_message(None, "user", "When is the meeting?", attachments=list(first.attachments))
    assert store.document_count() == 2 and _links(store) == 4
    store.close()

    store = Store(path)
    again = _open(store, conv.id)
    assert again.messages[first.id].attachments == [NOTES, TABLE]
    assert again.messages[edited.id].attachments == [NOTES, TABLE]
    # What the model reads: the files' blocks, then the question; the stored content is what was typed.
    assert again.messages[edited.id].content == "When is the meeting?"
    assert again.history(again.messages[edited.id])[-1]["content"] == compose_message(
        "When is the meeting?", [NOTES, TABLE]).text
    store.close()


def test_a_document_goes_with_the_last_conversation_that_links_it(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    a = _open(store, store.create_conversation("a").id)
    b = _open(store, store.create_conversation("b").id)
    a.add_message(None, "user", "q", attachments=[NOTES, TABLE])
    b.add_message(None, "user", "q", attachments=[NOTES])
    store.delete_conversation(a.id)
    assert store.document_count() == 1 and _open(store, b.id).path()[0].attachments == [NOTES]
    store.delete_conversation(b.id)
    assert store.document_count() == 0
    store.close()


def test_exports_carry_the_documents_once_and_name_them(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    conv = _open(store, store.create_conversation("c").id)
    first = conv.add_message(None, "user", "Summarise.", attachments=[NOTES])
    conv.add_message(None, "user", "Summarise briefly.", attachments=[NOTES, TABLE])
    data = json.loads(to_json(conv))
    assert set(data["documents"]) == {NOTES.sha256, TABLE.sha256}
    assert data["documents"][NOTES.sha256]["text"] == NOTES.text
    by_id = {m["id"]: m for m in data["messages"]}
    assert by_id[first.id]["attachments"] == [{"sha256": NOTES.sha256, "name": "notes.md"}]
    markdown = to_markdown(conv)
    assert "*Attached: `notes.md` (36 B), `table.csv` (8 B)*" in markdown
    assert "The meeting is on Tuesday" not in markdown  # named, not inlined
    store.close()


def _v3_database(path) -> None:
    """A database as version 3 wrote it: today's schema without the attachment tables."""
    conn = sqlite3.connect(path)
    for statement in filter(str.strip, SCHEMA.split(";")):
        if "documents" not in statement and "message_attachments" not in statement:
            conn.execute(statement)
    conn.execute("INSERT INTO conversations(title, system_prompt, created, updated) VALUES ('old chat', '', 1, 1)")
    conn.execute("INSERT INTO messages(conversation_id, parent_id, role, content, created) VALUES (1, NULL, 'user', 'hi', 1)")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()


def test_a_version_3_database_opens_with_its_chats_and_takes_attachments(tmp_path):
    path = tmp_path / "old.sqlite3"
    _v3_database(path)
    store = Store(path)
    (row,) = store.conversations()
    conv = _open(store, row.id)
    assert [m.content for m in conv.path()] == ["hi"] and conv.path()[0].attachments == []
    conv.add_message(conv.path()[0], "user", "and this?", attachments=[TABLE])
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4
    store = Store(path)
    assert _open(store, row.id).path()[-1].attachments == [TABLE]
    store.close()


def test_salvage_keeps_the_attachments_of_the_messages_it_keeps(tmp_path):
    from app.state.database.recovery import salvage_into

    source = Store(tmp_path / "source.sqlite3")
    conv = _open(source, source.create_conversation("c").id)
    conv.add_message(None, "user", "q", attachments=[NOTES, TABLE])
    source.close()
    target = Store(tmp_path / "target.sqlite3")
    salvage_into(tmp_path / "source.sqlite3", target)
    assert _open(target, conv.id).path()[0].attachments == [NOTES, TABLE]
    target.close()
