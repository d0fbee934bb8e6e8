"""SQLite persistence for conversations, messages, token records, settings and presets.

One connection, used from the UI thread only; WAL so that the frequent small
commits made while tokens stream are cheap and a crash leaves the database
at the last commit (at most the last batch of tokens is lost).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import TokenEvent

from app.state.records import token_from_row, token_row

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    active_root_id INTEGER
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
"""

# Columns of `messages` a caller may update, with how each is encoded.
_JSON_COLUMNS = {"request": "request_json", "model": "model_json", "stats": "stats_json"}
_PLAIN_COLUMNS = {"content", "active_child_id", "finish_reason", "branch_index"}


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float
    active_root_id: int | None


@dataclass(frozen=True)
class MessageRow:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    created: float
    active_child_id: int | None
    finish_reason: str | None
    branch_index: int | None
    request: dict[str, Any] | None
    model: dict[str, Any] | None
    stats: dict[str, Any] | None


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class Store:
    """The app's database. `Store(":memory:")` for a throwaway one."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, isolation_level=None)  # explicit transactions only
        self._conn.execute("PRAGMA foreign_keys = ON")
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL in WAL mode: commits survive an app crash; only a power cut can drop the last ones.
            self._conn.execute("PRAGMA synchronous = NORMAL")
        self._depth = 0
        with self.transaction():
            # Statement by statement: executescript() would commit behind the transaction's back.
            for statement in filter(str.strip, SCHEMA.split(";")):
                self._conn.execute(statement)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- plumbing --------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes into one commit (nested uses join the outer one)."""
        if self._depth == 0:
            self._conn.execute("BEGIN")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._conn.execute("ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._conn.execute("COMMIT")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None  # type: ignore[assignment]

    @property
    def closed(self) -> bool:
        return self._conn is None

    # -- settings and presets --------------------------------------------------------------

    def get_setting(self, key: str, default: Any = None) -> Any:
        row = self._conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def put_setting(self, key: str, value: Any) -> None:
        self._conn.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )

    def presets(self) -> dict[str, dict[str, Any]]:
        rows = self._conn.execute("SELECT name, sampler_json FROM presets ORDER BY name COLLATE NOCASE")
        return {name: json.loads(text) for name, text in rows}

    def save_preset(self, name: str, sampler: dict[str, Any]) -> None:
        self._conn.execute(
            "INSERT INTO presets(name, sampler_json) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET sampler_json = excluded.sampler_json",
            (name, json.dumps(sampler)),
        )

    def delete_preset(self, name: str) -> None:
        self._conn.execute("DELETE FROM presets WHERE name = ?", (name,))

    # -- conversations ---------------------------------------------------------------------

    def create_conversation(self, title: str, system_prompt: str = "") -> ConversationRow:
        now = time.time()
        cur = self._conn.execute(
            "INSERT INTO conversations(title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
            (title, system_prompt, now, now),
        )
        return ConversationRow(int(cur.lastrowid), title, system_prompt, now, now, None)

    def update_conversation(self, conversation_id: int, **fields: Any) -> None:
        allowed = {"title", "system_prompt", "active_root_id"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot update conversation fields {sorted(bad)}")
        fields["updated"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._conn.execute(f"UPDATE conversations SET {sets} WHERE id = ?", (*fields.values(), conversation_id))

    def touch_conversation(self, conversation_id: int) -> None:
        self._conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self._conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def conversation(self, conversation_id: int) -> ConversationRow | None:
        row = self._conn.execute(
            "SELECT id, title, system_prompt, created, updated, active_root_id FROM conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        return None if row is None else ConversationRow(*row)

    def conversations(self, query: str = "") -> list[ConversationRow]:
        """Newest first; `query` matches titles and message text (case-insensitive substring)."""
        sql = "SELECT id, title, system_prompt, created, updated, active_root_id FROM conversations"
        args: tuple[Any, ...] = ()
        if query.strip():
            pattern = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (
                " WHERE title LIKE ?1 ESCAPE '\\' OR system_prompt LIKE ?1 ESCAPE '\\' OR id IN "
                "(SELECT conversation_id FROM messages WHERE content LIKE ?1 ESCAPE '\\')"
            )
            args = (pattern,)
        sql += " ORDER BY updated DESC, id DESC"
        return [ConversationRow(*row) for row in self._conn.execute(sql, args)]

    # -- messages --------------------------------------------------------------------------

    def insert_message(
        self,
        conversation_id: int,
        parent_id: int | None,
        role: str,
        content: str = "",
        *,
        branch_index: int | None = None,
        request: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
    ) -> MessageRow:
        now = time.time()
        cur = self._conn.execute(
            "INSERT INTO messages(conversation_id, parent_id, role, content, created, branch_index, request_json, model_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                parent_id,
                role,
                content,
                now,
                branch_index,
                None if request is None else json.dumps(request),
                None if model is None else json.dumps(model),
            ),
        )
        self.touch_conversation(conversation_id)
        return MessageRow(
            int(cur.lastrowid), conversation_id, parent_id, role, content, now, None, None, branch_index, request, model, None
        )

    def update_message(self, message_id: int, **fields: Any) -> None:
        cols: list[str] = []
        vals: list[Any] = []
        for key, value in fields.items():
            if key in _JSON_COLUMNS:
                cols.append(_JSON_COLUMNS[key])
                vals.append(None if value is None else json.dumps(value))
            elif key in _PLAIN_COLUMNS:
                cols.append(key)
                vals.append(value)
            else:
                raise ValueError(f"cannot update message field {key!r}")
        if cols:
            sets = ", ".join(f"{c} = ?" for c in cols)
            self._conn.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*vals, message_id))

    def messages(self, conversation_id: int) -> list[MessageRow]:
        rows = self._conn.execute(
            "SELECT id, conversation_id, parent_id, role, content, created, active_child_id, finish_reason, "
            "branch_index, request_json, model_json, stats_json FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        return [MessageRow(*r[:9], _loads(r[9]), _loads(r[10]), _loads(r[11])) for r in rows]

    # -- token records ---------------------------------------------------------------------

    def write_tokens(self, message_id: int, events: Iterable[TokenEvent]) -> None:
        self._conn.executemany(
            "INSERT OR REPLACE INTO tokens(message_id, idx, token_id, text, token_text, logprob, sampler_logprob, "
            "rank, entropy, forced, special, top_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (token_row(message_id, ev) for ev in events),
        )

    def tokens(self, message_id: int) -> list[TokenEvent]:
        rows = self._conn.execute(
            "SELECT idx, token_id, text, token_text, logprob, sampler_logprob, rank, entropy, forced, special, top_json "
            "FROM tokens WHERE message_id = ? ORDER BY idx",
            (message_id,),
        )
        return [token_from_row(r) for r in rows]

    def token_count(self, message_id: int) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM tokens WHERE message_id = ?", (message_id,)).fetchone()[0])
