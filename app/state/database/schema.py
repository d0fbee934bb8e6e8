"""The app's database schema, in one place: its tables (conversations, messages and their tokens, settings, presets,
attached documents, folders and tags), its version, and how an older database is brought up to it. The store
(app/state/database/store.py) opens and migrates with these; folders.py, attachments and recovery read the tables."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 5  # 2: conversations.mode ("chat" | "notebook"); 3: conversations.served_json (Model ▸ Serve…);
# 4: documents + message_attachments (files attached to user messages, docs/documents.md); 5: folders and tags
# (app/state/folders.py reads and writes them)
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    active_root_id INTEGER,
    mode TEXT NOT NULL DEFAULT 'chat',
    served_json TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    active_child_id INTEGER,
    finish_reason TEXT,
    branch_index INTEGER,
    request_json TEXT,
    model_json TEXT,
    stats_json TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id);
CREATE TABLE IF NOT EXISTS tokens (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    token_id INTEGER NOT NULL,
    text TEXT NOT NULL,
    token_text TEXT NOT NULL,
    logprob REAL,
    sampler_logprob REAL,
    rank INTEGER NOT NULL,
    entropy REAL NOT NULL,
    forced INTEGER NOT NULL,
    special INTEGER NOT NULL,
    top_json TEXT NOT NULL,
    PRIMARY KEY (message_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS presets (name TEXT PRIMARY KEY, sampler_json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    sha256 TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    media_kind TEXT NOT NULL,
    encoding TEXT NOT NULL,
    text TEXT NOT NULL,
    created REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS message_attachments (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    sha256 TEXT NOT NULL REFERENCES documents(sha256),
    name TEXT NOT NULL,
    PRIMARY KEY (message_id, idx)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS message_attachments_by_document ON message_attachments(sha256);
CREATE TABLE IF NOT EXISTS folders (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS conversation_folders (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    folder_id INTEGER NOT NULL REFERENCES folders(id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS conversation_folders_by_folder ON conversation_folders(folder_id);
CREATE TABLE IF NOT EXISTS conversation_tags (
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    tag TEXT NOT NULL,
    UNIQUE (conversation_id, tag)
);
"""


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a database of an older version up to `SCHEMA_VERSION` (inside the opening transaction).

    Version 1 had no `conversations.mode`: every conversation in it is a chat, the column's default.
    Version 2 had no `conversations.served_json`: none of its conversations was served (NULL).
    Version 3 had no attachments: `documents` and `message_attachments` are made empty by SCHEMA's
    CREATE TABLE IF NOT EXISTS, so its messages simply have none. Version 4 had no folders or tags: their
    tables are made empty the same way, so its chats are in no folder and untagged.
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(conversations)")}
    if "mode" not in columns:
        conn.execute("ALTER TABLE conversations ADD COLUMN mode TEXT NOT NULL DEFAULT 'chat'")
    if "served_json" not in columns:
        conn.execute("ALTER TABLE conversations ADD COLUMN served_json TEXT")
