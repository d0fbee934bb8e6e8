"""SQLite persistence for conversations, messages, token records, settings and presets.

One connection, used from the UI thread only; WAL so that the frequent small
commits made while tokens stream are cheap and a crash leaves the database
at the last commit (at most the last batch of tokens is lost).

Another connection (a second Logit Lab on the same file, a script) can hold
SQLite's write lock. SQLite's busy wait would then block the UI thread, so
this connection waits at most `BUSY_TIMEOUT_S` per write: a write that meets
the lock raises `DatabaseBusy` (callers keep what they meant to write and try
again from the event loop, `wait_writable`; the window's actions wait in
app/state/database/write_queue.py), a setting or preset is kept in memory and
written once the lock is free, and `busy_changed` tells the window, which says
so in its status bar. Opening and closing wait longer (`OPEN_TIMEOUT_S`): no
window is waiting then, and at close nothing may be lost.

Reads never fail on damage: what can be read is returned, and `damaged`
says what could not be (and a marker file asks the next start to repair the
file, app/state/database/recovery.py). Writes raise `sqlite3.Error`; the controller
keeps what it could not write and tries again.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from engine import TokenEvent
from engine import documents

from app.state.observable import Signal
from app.state.database.setting_keys import keys_of_chat
from app.state.database.schema import SCHEMA, SCHEMA_VERSION, migrate  # noqa: F401  (SCHEMA read from here by tests)
from app.state.database.records import token_from_row, token_row
from app.state.database.row_reader import ROW_ERRORS, count_rows, read_past_damage
from app.state.database.stored_rows import (  # noqa: F401  (read from here by recovery and the window)
    MODES, ConversationRow, MessageRow, conversation_from_row, message_from_row,
)
from app.state.database.write_lock import (  # noqa: F401  (read from here by the controllers)
    BUSY_TEXT, BUSY_TIMEOUT_S, OPEN_TIMEOUT_S, DatabaseBusy, busy_as_database_busy, is_busy,
)


class WaitingWrites(Protocol):
    """What the store asks of the UI's write queue (app/state/database/write_queue.py, which imports this module)."""

    def run_waiting_now(self) -> None: ...


log = logging.getLogger(__name__)

MEMORY = ":memory:"
REPAIR_MARKER_SUFFIX = ".needs-repair"  # next to the database: damage was met; recover at the next start

# Columns of `messages` a caller may update, with how each is encoded.
_JSON_COLUMNS = {"request": "request_json", "model": "model_json", "stats": "stats_json"}
_PLAIN_COLUMNS = {"content", "active_child_id", "finish_reason", "branch_index"}



_URL_CREDENTIALS = re.compile(r"(?i)\b(https?://)[^/@\s]+@")


def without_url_credentials(value: Any) -> Any:
    """`value` (JSON-like) with every http(s) URL's "user:password@" removed: credentials typed into a server
    URL live with the API key (app/state/models/servers.py), never in the database or its WAL."""
    if isinstance(value, str):
        return _URL_CREDENTIALS.sub(r"\1", value) if "@" in value else value
    if isinstance(value, dict):
        return {k: without_url_credentials(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_url_credentials(v) for v in value]
    return value

_MESSAGE_COLUMNS = (
    "id, conversation_id, parent_id, role, content, created, active_child_id, finish_reason, "
    "branch_index, request_json, model_json, stats_json"
)
_CONVERSATION_COLUMNS = "id, title, system_prompt, created, updated, active_root_id, mode, served_json"
_TOKEN_COLUMNS = "idx, token_id, text, token_text, logprob, sampler_logprob, rank, entropy, forced, special, top_json"


def _inserted_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made (sqlite3 sets it after every INSERT into these rowid tables)."""
    if cur.lastrowid is None:
        raise sqlite3.DatabaseError("the database did not report the new row's id")
    return cur.lastrowid


class NewerSchemaError(sqlite3.DatabaseError):
    """The database was written by a newer Logit Lab (schema version above ours): never downgrade it."""

    def __init__(self, path: str, version: int):
        super().__init__(
            f"{path} was written by a newer version of Logit Lab (database version {version}; "
            f"this version knows {SCHEMA_VERSION}). It was left untouched: open it with the newer version."
        )
        self.version = version


class Store:
    """The app's database. `Store(":memory:")` for a throwaway one (nothing saved)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.damaged = Signal()  # (str) a read met damage: what could not be read
        self.damage_seen: list[str] = []
        self.busy_changed = Signal()  # (bool) another connection holds the write lock / it is free again
        self.busy = False
        self._deferred_settings: dict[str, str] = {}  # key -> JSON: settings written while the lock was held elsewhere
        self._deferred_presets: dict[str, str | None] = {}  # name -> JSON (None: deleted), as the settings
        # The UI's actions waiting for the lock (app/state/database/write_queue.py), made on first use.
        self.write_queue: WaitingWrites | None = None
        # Explicit transactions only. Opening waits long for a lock held elsewhere (no window yet); every
        # later write waits at most BUSY_TIMEOUT_S, then raises DatabaseBusy (see the module doc).
        self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=OPEN_TIMEOUT_S)
        try:
            # Before anything writes: a newer app's database is never touched (no WAL switch, no schema).
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise NewerSchemaError(self.path, version)
            self._conn.execute("PRAGMA foreign_keys = ON")
            if self.path != MEMORY:
                self._conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode: commits survive an app crash; only a power cut can drop the last ones.
                self._conn.execute("PRAGMA synchronous = NORMAL")
            self._depth = 0
            with self.transaction():
                # Statement by statement: executescript() would commit behind the transaction's back.
                for statement in filter(str.strip, SCHEMA.split(";")):
                    self._conn.execute(statement)
                migrate(self._conn)
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._set_busy_timeout(BUSY_TIMEOUT_S)
        except BaseException:
            self._conn.close()
            raise

    @property
    def temporary(self) -> bool:
        """An in-memory database: nothing is saved."""
        return self.path == MEMORY

    # -- plumbing --------------------------------------------------------------------------

    def _set_busy_timeout(self, seconds: float) -> None:
        self._conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    def _set_busy(self, busy: bool) -> None:
        if busy != self.busy:
            self.busy = busy
            log.info("%s", BUSY_TEXT if busy else "the database's write lock is free again")
            self.busy_changed.emit(busy)

    def _begin(self) -> None:
        # IMMEDIATE: take the write lock now, so a lock held elsewhere shows here (one bounded wait), never
        # halfway through a transaction.
        with busy_as_database_busy(lambda: self._set_busy(True)):
            self._conn.execute("BEGIN IMMEDIATE")

    def _write(self, sql: str, params: Any = (), many: bool = False) -> sqlite3.Cursor:
        """Run one writing statement; a lock held elsewhere raises DatabaseBusy (nothing written)."""
        with busy_as_database_busy(lambda: self._set_busy(True)):
            cur = self._conn.executemany(sql, params) if many else self._conn.execute(sql, params)
        if self._depth == 0:
            self._set_busy(False)
        return cur

    def can_write_now(self) -> bool:
        """Whether a write could start at once (another connection holds no write lock); never waits."""
        if self._conn is None or self._depth or self.temporary:
            return True  # closed (writes say so themselves), inside our own transaction, or in memory: no lock to wait for
        self._set_busy_timeout(0)
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            if not is_busy(e):
                return True  # not the lock (a read-only or full database): the write itself says what is wrong
            self._set_busy(True)
            return False
        finally:
            self._set_busy_timeout(BUSY_TIMEOUT_S)
        self._set_busy(False)
        try:
            self.write_deferred()
        except sqlite3.Error as e:  # taken again in between, or a real failure: the settings stay in memory
            log.info("settings kept in memory for now: %s", e)
        return True

    async def wait_writable(self, poll_s: float = 0.1, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Wait on the event loop (never blocking it) until a write can start; False if `cancelled()` first."""
        import asyncio

        while not self.can_write_now():
            if cancelled():
                return False
            await asyncio.sleep(poll_s)
        return True

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes into one commit (nested uses join the outer one). Raises DatabaseBusy, having written
        nothing, when another connection holds the write lock for longer than `BUSY_TIMEOUT_S`."""
        if self._depth == 0:
            self._begin()
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
            try:
                self._conn.execute("COMMIT")
                self._set_busy(False)
            except sqlite3.Error:
                # A failed COMMIT (disk full, I/O error) can leave the transaction open: end it, so the
                # next write starts clean and a retry can succeed.
                if self._conn.in_transaction:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        log.debug("rollback after a failed commit failed too", exc_info=True)
                raise

    def checkpoint(self) -> None:
        """Move the WAL's pages into the database file and empty the WAL (best effort)."""
        if self._conn is not None and not self.temporary:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as e:
                log.warning("checkpointing %s failed: %s", self.path, e)

    def close(self) -> None:
        """Write what waited for the lock, checkpoint and close; the last connection's close removes the WAL."""
        if self._conn is not None:
            if self._conn.in_transaction:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            try:
                self._set_busy_timeout(OPEN_TIMEOUT_S)  # closing: wait for a lock held elsewhere, lose nothing
                if self.write_queue is not None:
                    self.write_queue.run_waiting_now()
                self.write_deferred()
            except sqlite3.Error as e:
                log.warning("settings could not be written before closing %s: %s", self.path, e)
            self.checkpoint()
            try:
                self._conn.close()
            except sqlite3.Error as e:
                log.warning("closing %s failed: %s", self.path, e)
            self._conn = None  # type: ignore[assignment]  # closed: any later use fails loudly

    @property
    def closed(self) -> bool:
        return self._conn is None

    # -- settings and presets --------------------------------------------------------------

    def _damage(self, what: str, error: str | None) -> None:
        """A read met damage: log it, tell the window, and ask the next start to repair the file."""
        text = what if error is None else f"{what} ({error})"
        log.error("database damage in %s: %s", self.path, text)
        self.damage_seen.append(text)
        if not self.temporary:
            try:
                Path(self.path + REPAIR_MARKER_SUFFIX).write_text(text + "\n", encoding="utf-8")
            except OSError as e:
                log.warning("cannot mark %s for repair: %s", self.path, e)
        self.damaged.emit(text)

    def get_setting(self, key: str, default: Any = None) -> Any:
        if key in self._deferred_settings:  # written while the lock was held elsewhere: not on disk yet
            return json.loads(self._deferred_settings[key])
        try:
            row = self._conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
            return default if row is None else json.loads(row[0])
        except ROW_ERRORS as e:
            self._damage(f"the setting {key!r} could not be read", f"{type(e).__name__}: {e}")
            return default

    def put_setting(self, key: str, value: Any) -> None:
        """Save a setting. While another connection holds the write lock it is kept in memory (read back from
        there) and written with the next write that gets through, or at close."""
        self._deferred_settings[key] = json.dumps(without_url_credentials(value))  # a value JSON refuses raises here
        try:
            self.write_deferred()
        except DatabaseBusy:
            pass  # kept; the window says the database is busy

    def write_deferred(self) -> None:
        """Write the settings and presets that waited for the lock (raises DatabaseBusy while it is still held)."""
        if not (self._deferred_settings or self._deferred_presets) or self._conn is None:
            return
        pending = dict(self._deferred_settings)
        presets = dict(self._deferred_presets)
        with self.transaction():
            self._conn.executemany(
                "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                list(pending.items()),
            )
            for name, value in presets.items():
                if value is None:
                    self._conn.execute("DELETE FROM presets WHERE name = ?", (name,))
                else:
                    self._conn.execute(
                        "INSERT INTO presets(name, sampler_json) VALUES (?, ?) "
                        "ON CONFLICT(name) DO UPDATE SET sampler_json = excluded.sampler_json",
                        (name, value),
                    )
        for deferred, written in ((self._deferred_settings, pending), (self._deferred_presets, presets)):
            for k, v in written.items():
                if k in deferred and deferred[k] is v:
                    del deferred[k]

    def presets(self) -> dict[str, dict[str, Any]]:
        read = read_past_damage(self._conn, "presets", "name, sampler_json", lambda r: (str(r[0]), json.loads(r[1])))
        if read.damaged:
            self._damage(f"{read.damaged} saved preset(s) could not be read", read.first_error)
        rows = dict(read.rows)
        for name, value in self._deferred_presets.items():  # saved or deleted while the lock was held elsewhere
            if value is None:
                rows.pop(name, None)
            else:
                rows[name] = json.loads(value)
        return dict(sorted(rows.items(), key=lambda item: item[0].lower()))

    def save_preset(self, name: str, sampler: dict[str, Any]) -> None:
        """Save a preset; while another connection holds the write lock it waits in memory, as a setting does."""
        self._deferred_presets[name] = json.dumps(sampler)
        try:
            self.write_deferred()
        except DatabaseBusy:
            pass  # kept; the window says the database is busy

    def delete_preset(self, name: str) -> None:
        self._deferred_presets[name] = None
        try:
            self.write_deferred()
        except DatabaseBusy:
            pass

    # -- conversations ---------------------------------------------------------------------

    def create_conversation(self, title: str, system_prompt: str = "", mode: str = "chat",
                            served: dict[str, Any] | None = None) -> ConversationRow:
        """A new conversation; `served`: the request a client sent the window's server (None: the window's own)."""
        if mode not in MODES:
            raise ValueError(f"a conversation is a chat or a notebook, not {mode!r}")
        now = time.time()
        cur = self._write(
            "INSERT INTO conversations(title, system_prompt, created, updated, mode, served_json) VALUES (?, ?, ?, ?, ?, ?)",
            (title, system_prompt, now, now, mode, None if served is None else json.dumps(without_url_credentials(served))),
        )
        return ConversationRow(_inserted_id(cur), title, system_prompt, now, now, None, mode, served)

    def update_conversation(self, conversation_id: int, **fields: Any) -> None:
        allowed = {"title", "system_prompt", "active_root_id", "mode"}
        if "mode" in fields and fields["mode"] not in MODES:
            raise ValueError(f"a conversation is a chat or a notebook, not {fields['mode']!r}")
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot update conversation fields {sorted(bad)}")
        fields["updated"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._write(f"UPDATE conversations SET {sets} WHERE id = ?", (*fields.values(), conversation_id))

    def touch_conversation(self, conversation_id: int) -> None:
        self._write("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self.transaction():
            messages = [int(r[0]) for r in self._conn.execute(
                "SELECT id FROM messages WHERE conversation_id = ?", (conversation_id,))]
            self._write("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            # Its tools and its calls' results live in the settings table (app/state/tool_settings.py).
            keys = keys_of_chat(conversation_id, messages)
            self._write("DELETE FROM settings WHERE key = ?", [(k,) for k in keys], many=True)
            for k in keys:
                self._deferred_settings.pop(k, None)
            self._forget_unlinked_documents()

    def conversation(self, conversation_id: int) -> ConversationRow | None:
        try:
            row = self._conn.execute(
                f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            return None if row is None else conversation_from_row(row)
        except ROW_ERRORS as e:
            self._damage(f"conversation {conversation_id} could not be read", f"{type(e).__name__}: {e}")
            return None

    def conversations(self, query: str = "") -> list[ConversationRow]:
        """Newest first; `query` matches titles and message text (case-insensitive substring)."""
        sql = f"SELECT {_CONVERSATION_COLUMNS} FROM conversations"
        args: tuple[Any, ...] = ()
        if query.strip():
            pattern = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (
                " WHERE title LIKE ?1 ESCAPE '\\' OR system_prompt LIKE ?1 ESCAPE '\\' OR id IN "
                "(SELECT conversation_id FROM messages WHERE content LIKE ?1 ESCAPE '\\')"
            )
            args = (pattern,)
        sql += " ORDER BY updated DESC, id DESC"
        try:
            return [conversation_from_row(row) for row in self._conn.execute(sql, args)]
        except ROW_ERRORS as e:
            error = f"{type(e).__name__}: {e}"
        # Damage on the way: every conversation that can still be read (the search then matches titles only).
        read = read_past_damage(self._conn, "conversations", _CONVERSATION_COLUMNS, conversation_from_row)
        rows = read.rows
        if query.strip():
            needle = query.strip().lower()
            rows = [r for r in rows if needle in r.title.lower() or needle in r.system_prompt.lower()]
        self._damage(f"{read.damaged or 'some'} conversation(s) could not be listed", read.first_error or error)
        return sorted(rows, key=lambda r: (r.updated, r.id), reverse=True)

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
        cur = self._write(
            "INSERT INTO messages(conversation_id, parent_id, role, content, created, branch_index, request_json, model_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                parent_id,
                role,
                content,
                now,
                branch_index,
                None if request is None else json.dumps(without_url_credentials(request)),
                None if model is None else json.dumps(without_url_credentials(model)),
            ),
        )
        self.touch_conversation(conversation_id)
        return MessageRow(
            _inserted_id(cur), conversation_id, parent_id, role, content, now, None, None, branch_index, request, model, None
        )

    def update_message(self, message_id: int, **fields: Any) -> None:
        cols: list[str] = []
        vals: list[Any] = []
        for key, value in fields.items():
            if key in _JSON_COLUMNS:
                cols.append(_JSON_COLUMNS[key])
                vals.append(None if value is None else json.dumps(without_url_credentials(value)))
            elif key in _PLAIN_COLUMNS:
                cols.append(key)
                vals.append(value)
            else:
                raise ValueError(f"cannot update message field {key!r}")
        if cols:
            sets = ", ".join(f"{c} = ?" for c in cols)
            self._write(f"UPDATE messages SET {sets} WHERE id = ?", (*vals, message_id))

    def messages(self, conversation_id: int) -> list[MessageRow]:
        """The conversation's messages that can be read (damage is reported through `damaged`)."""
        try:
            rows = self._conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
            )
            return [message_from_row(r) for r in rows]
        except ROW_ERRORS as e:
            error = f"{type(e).__name__}: {e}"
        read = read_past_damage(
            self._conn, "messages", _MESSAGE_COLUMNS, message_from_row, "conversation_id = ?", (conversation_id,)
        )
        total = count_rows(self._conn, "SELECT count(*) FROM messages WHERE conversation_id = ?", (conversation_id,))
        shown = len(read.rows)
        lost = f"{total - shown} of {total}" if total is not None and total > shown else "some"
        self._damage(f"{lost} messages of this conversation could not be read ({shown} shown)", read.first_error or error)
        return read.rows

    # -- token records ---------------------------------------------------------------------

    def write_tokens(self, message_id: int, events: Iterable[TokenEvent]) -> None:
        self._write(
            "INSERT OR REPLACE INTO tokens(message_id, idx, token_id, text, token_text, logprob, sampler_logprob, "
            "rank, entropy, forced, special, top_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (token_row(message_id, ev) for ev in events),
            many=True,
        )

    def tokens(self, message_id: int) -> list[TokenEvent]:
        """The message's token records up to the first that cannot be read.

        Only an unbroken run from index 0 is of use (Continue and branching rebuild the
        token ids from it), so a damaged record ends the list; the loss is reported.
        """
        events, error = read_tokens(self._conn, message_id)
        if error is not None:
            total = count_rows(self._conn, "SELECT count(*) FROM tokens WHERE message_id = ?", (message_id,))
            lost = f"{total - len(events)} of {total}" if total is not None and total > len(events) else "some"
            self._damage(f"{lost} token records of an answer could not be read ({len(events)} shown)", error)
        return events

    # -- attachments (content-addressed: one `documents` row per file's bytes, linked from each message) -----

    def attach_documents(self, message_id: int, attachments: Iterable[documents.Attachment]) -> None:
        """Link `attachments`, in order, to the message. A document already stored (the same bytes, attached to
        another message, a branch or an edit of this one) is not written again: both links name its row."""
        now = time.time()
        with self.transaction():
            for idx, a in enumerate(attachments):
                self._write("INSERT OR IGNORE INTO documents(sha256, size, media_kind, encoding, text, created) "
                            "VALUES (?, ?, ?, ?, ?, ?)", (a.sha256, a.size, a.media_kind, a.encoding, a.text, now))
                self._write("INSERT OR REPLACE INTO message_attachments(message_id, idx, sha256, name) VALUES (?, ?, ?, ?)",
                            (message_id, idx, a.sha256, a.name))

    def attachments_of(self, conversation_id: int) -> dict[int, list[documents.Attachment]]:
        """Each message of the conversation that has attachments -> them, in the order attached."""
        out: dict[int, list[documents.Attachment]] = {}
        try:
            rows = self._conn.execute(
                "SELECT a.message_id, a.name, d.size, d.media_kind, d.text, d.sha256, d.encoding "
                "FROM message_attachments a JOIN documents d ON d.sha256 = a.sha256 JOIN messages m ON m.id = a.message_id "
                "WHERE m.conversation_id = ? ORDER BY a.message_id, a.idx", (conversation_id,))
            for message_id, name, size, kind, text, sha256, encoding in rows:
                out.setdefault(int(message_id), []).append(
                    documents.Attachment(name=str(name), size=int(size), media_kind=str(kind), text=str(text),
                               sha256=str(sha256), encoding=str(encoding)))
        except ROW_ERRORS as e:
            self._damage("the attachments of this conversation could not be read", f"{type(e).__name__}: {e}")
        return out

    def document_count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0])

    def _forget_unlinked_documents(self) -> None:
        # A document no message links to any more (its conversations deleted) is dropped with the last of them.
        self._write("DELETE FROM documents WHERE sha256 NOT IN (SELECT sha256 FROM message_attachments)")

    def insert_rows(self, table: str, columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> None:
        """Insert rows as they are (ids included): recovery copies what it read into a fresh database."""
        if table not in ("conversations", "messages", "tokens", "settings", "presets", "documents", "message_attachments"):
            raise ValueError(f"unknown table {table!r}")
        marks = ", ".join("?" * len(columns))
        self._write(f"INSERT OR REPLACE INTO {table}({', '.join(columns)}) VALUES ({marks})", rows, many=True)

    def token_count(self, message_id: int) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM tokens WHERE message_id = ?", (message_id,)).fetchone()[0])


def read_tokens(conn: sqlite3.Connection, message_id: int) -> tuple[list[TokenEvent], str | None]:
    """The unbroken run of readable token records from index 0, and the first error met (None: all read)."""
    events: list[TokenEvent] = []
    try:
        rows = conn.execute(
            f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE message_id = ? ORDER BY idx", (message_id,)
        )
        for row in rows:
            event = token_from_row(row)
            if event.index != len(events):
                return events, f"token record {len(events)} is missing"
            events.append(event)
    except ROW_ERRORS as e:
        return events, f"{type(e).__name__}: {e}"
    return events, None
