"""Open the app's database whatever state it is in: the window always starts.

- Healthy: opened as usual.
- Damaged (`PRAGMA quick_check` fails, SQLite refuses the file, or a read met damage in an
  earlier session and left a repair marker): the file and its -wal/-shm are moved aside
  with a timestamp, every conversation, message, token record, setting and preset that can
  still be read is copied into a fresh database, and a notice says what was recovered and
  where the damaged file is.
- Written by a newer Logit Lab: left untouched (never downgraded).
- Cannot be written at all (read-only folder, `chattr +i`, a damaged file that cannot be
  moved): the app runs on a temporary in-memory database and says so.
In the last two cases the window offers to go on without saving or to quit.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.state import folders
from app.state.database.records import token_from_row
from app.state.database.row_reader import count_rows, read_past_damage
from app.state.database.store import (
    MEMORY,
    REPAIR_MARKER_SUFFIX,
    SCHEMA_VERSION,
    NewerSchemaError,
    Store,
    conversation_from_row,
    message_from_row,
)

log = logging.getLogger(__name__)

SIDE_FILES = ("-wal", "-shm")
# SQLite's own words for "the file is not (or no longer) a database we can trust".
_DAMAGE_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_FORMAT"}
_MESSAGE_COLUMNS = (
    "id", "conversation_id", "parent_id", "role", "content", "created", "active_child_id", "finish_reason",
    "branch_index", "request_json", "model_json", "stats_json",
)
_CONVERSATION_COLUMNS = ("id", "title", "system_prompt", "created", "updated", "active_root_id")
_TOKEN_COLUMNS = (
    "message_id", "idx", "token_id", "text", "token_text", "logprob", "sampler_logprob", "rank", "entropy",
    "forced", "special", "top_json",
)


@dataclass(frozen=True)
class DatabaseNotice:
    """What the user must be told about the database at start-up (one dialog)."""

    kind: str  # "recovered" | "newer" | "unusable"
    title: str
    text: str
    path: Path
    moved_to: Path | None = None  # where the damaged file now is

    @property
    def temporary(self) -> bool:
        """The app runs on a temporary database: nothing is saved."""
        return self.kind != "recovered"


@dataclass(frozen=True)
class OpenedDatabase:
    store: Store
    notice: DatabaseNotice | None = None


@dataclass
class Salvage:
    """What was copied out of a damaged database."""

    conversations: int = 0
    conversations_total: int | None = None
    placeholders: int = 0  # conversations whose own row was lost but whose messages were read
    messages: int = 0
    messages_total: int | None = None
    rerooted: int = 0  # messages whose parent was lost: now the start of a branch
    tokens: int = 0
    tokens_total: int | None = None
    settings: int = 0
    damaged_spots: int = 0
    readable: bool = True  # False: SQLite could read nothing at all (not a database, first page gone)


def open_database(path: str | Path) -> OpenedDatabase:
    """The store to run on, and the notice to show (None when all is well)."""
    path = Path(path)
    marker = Path(str(path) + REPAIR_MARKER_SUFFIX)
    problem: str | None = None
    if path.exists():
        try:
            problem = check_database(path)
        except NewerSchemaError as e:
            return _temporary(path, "newer", "Database from a newer Logit Lab", str(e))
        if problem is None and marker.exists():
            problem = "an earlier session could not read part of it: " + _read_text(marker)
    if problem is None:
        try:
            return OpenedDatabase(Store(path))
        except NewerSchemaError as e:
            return _temporary(path, "newer", "Database from a newer Logit Lab", str(e))
        except sqlite3.DatabaseError as e:
            if not _is_damage(e):
                return _unusable(path, e)
            problem = f"SQLite cannot open it: {e}"
        except OSError as e:
            return _unusable(path, e)
    return _recover(path, problem, marker)


def check_database(path: Path) -> str | None:
    """None if the file looks sound, else what is wrong; raises `NewerSchemaError` for a newer schema."""
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        return None if not _is_damage(e) else f"SQLite cannot open it: {e}"
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(str(path), version)
        result = [str(r[0]) for r in conn.execute("PRAGMA quick_check")]
        if result != ["ok"]:
            lines = [line for text in result for line in text.splitlines() if not line.startswith("***")]
            return "the integrity check failed: " + "; ".join(lines[:2])[:200]
        return None
    except NewerSchemaError:
        raise
    except sqlite3.DatabaseError as e:
        # Opening read-only can fail for want of a writable folder (WAL's -shm): that is Store's to judge.
        return f"SQLite cannot read it: {e}" if _is_damage(e) else None
    finally:
        conn.close()


def _is_damage(error: BaseException) -> bool:
    name = getattr(error, "sqlite_errorname", "")
    if name:
        return any(name.startswith(code) for code in _DAMAGE_CODES)
    text = str(error).lower()
    return "malformed" in text or "not a database" in text or "corrupt" in text


def _recover(path: Path, problem: str, marker: Path) -> OpenedDatabase:
    log.error("the database %s is damaged: %s", path, problem)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = path.with_name(f"{path.name}.damaged-{stamp}")
    try:
        move_aside(path, moved)
    except OSError as e:
        return _unusable(path, e, f"is damaged ({problem}) and cannot be moved aside")
    try:
        store = Store(path)
    except (sqlite3.Error, OSError) as e:
        return _unusable(path, e, f"was damaged ({problem}) and moved to {moved}, but a fresh one cannot be made")
    try:
        salvage = salvage_into(moved, store)
    except Exception as e:  # noqa: BLE001 - whatever happens, the fresh database and the notice stand
        log.exception("salvaging %s failed", moved)
        salvage = Salvage(readable=False)
        problem += f"; copying out failed: {e}"
    marker.unlink(missing_ok=True)
    log.warning("recovered %s into a fresh database: %s", moved, salvage)
    return OpenedDatabase(
        store,
        DatabaseNotice("recovered", "The database was damaged", _recovered_text(path, moved, problem, salvage), path, moved),
    )


def move_aside(path: Path, moved: Path) -> None:
    """Rename the database and its -wal/-shm together (SQLite then still finds the WAL of the copy)."""
    os.replace(path, moved)
    for suffix in SIDE_FILES:
        side = Path(str(path) + suffix)
        if side.exists():
            os.replace(side, Path(str(moved) + suffix))


def salvage_into(source: Path, store: Store) -> Salvage:
    """Copy every readable row of `source` into `store` (one transaction); never raises for damage."""
    with tempfile.TemporaryDirectory(prefix="logitlab-salvage-") as scratch:
        # A truncated file: SQLite trusts the page count in its header and calls the whole file
        # malformed. A copy padded to that size reads again up to where the file was cut.
        readable = _padded_copy(source, Path(scratch)) or source
        result = Salvage()
        try:
            conn = sqlite3.connect(f"{readable.as_uri()}?mode=ro", uri=True)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as e:
            log.warning("nothing can be read from %s: %s", source, e)
            result.readable = False
            return result
        try:
            with store.transaction():
                _copy(conn, store, result)
        finally:
            conn.close()
        return result


def _padded_copy(source: Path, folder: Path) -> Path | None:
    """A copy of a SQLite file shorter than its header says, padded with zeros (None: not needed)."""
    try:
        with open(source, "rb") as f:
            header = f.read(100)
        size = source.stat().st_size
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        return None
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if page_size < 512 or pages * page_size <= size or pages * page_size > 64 * size + (1 << 30):
        return None
    copy = folder / source.name
    shutil.copyfile(source, copy)
    with open(copy, "r+b") as f:
        f.truncate(pages * page_size)  # extends with zeros
    for suffix in SIDE_FILES[:1]:  # the WAL belongs with it
        side = Path(str(source) + suffix)
        if side.exists():
            shutil.copyfile(side, Path(str(copy) + suffix))
    return copy


def _copy(conn: sqlite3.Connection, store: Store, result: Salvage) -> None:
    # A notebook stays a notebook: `mode` is read where the file has it (databases before version 2 do not);
    # a served conversation stays served (`served_json`, version 3), its record read when it reads.
    columns = _CONVERSATION_COLUMNS + (("mode",) if _has_column(conn, "mode") else ())
    if "mode" in columns and _has_column(conn, "served_json"):
        columns += ("served_json",)
    conversations = read_past_damage(conn, "conversations", ", ".join(columns), conversation_from_row)
    messages = read_past_damage(conn, "messages", ", ".join(_MESSAGE_COLUMNS), message_from_row)
    settings = read_past_damage(conn, "settings", "key, value", lambda r: (str(r[0]), str(r[1])))
    presets = read_past_damage(conn, "presets", "name, sampler_json", lambda r: (str(r[0]), str(r[1])))
    result.damaged_spots = conversations.damaged + messages.damaged + settings.damaged + presets.damaged
    result.conversations_total = count_rows(conn, "SELECT count(*) FROM conversations")
    result.messages_total = count_rows(conn, "SELECT count(*) FROM messages")
    result.tokens_total = count_rows(conn, "SELECT count(*) FROM tokens")

    rows = {c.id: (c.id, c.title, c.system_prompt, c.created, c.updated, c.active_root_id, c.mode,
                   None if c.served is None else json.dumps(c.served)) for c in conversations.rows}
    result.conversations = len(rows)
    for m in messages.rows:  # messages whose conversation row was lost: keep them under a placeholder
        if m.conversation_id not in rows:
            rows[m.conversation_id] = (m.conversation_id, f"Recovered conversation {m.conversation_id}", "", m.created,
                                       m.created, None, "chat", None)
            result.placeholders += 1
    store.insert_rows("conversations", _CONVERSATION_COLUMNS + ("mode", "served_json"), rows.values())

    kept: set[int] = set()
    message_rows = []
    for m in sorted(messages.rows, key=lambda m: m.id):  # parents come before their children
        parent = m.parent_id
        if parent is not None and parent not in kept:
            parent = None  # its parent was lost: it starts a branch of its own rather than vanish
            result.rerooted += 1
        kept.add(m.id)
        message_rows.append(
            (m.id, m.conversation_id, parent, m.role, m.content, m.created, m.active_child_id, m.finish_reason,
             m.branch_index, *(None if v is None else json.dumps(v) for v in (m.request, m.model, m.stats)))
        )
    store.insert_rows("messages", _MESSAGE_COLUMNS, message_rows)
    result.messages = len(message_rows)

    for m in messages.rows:
        if m.role == "assistant":
            rows_read = _token_rows(conn, m.id)
            store.insert_rows("tokens", _TOKEN_COLUMNS, rows_read)
            result.tokens += len(rows_read)
    store.insert_rows("settings", ("key", "value"), settings.rows)
    store.insert_rows("presets", ("name", "sampler_json"), presets.rows)
    result.settings = len(settings.rows) + len(presets.rows)
    _copy_attachments(conn, store, kept)
    folders.salvage(conn, store, set(rows))  # version 5: the folders and tags of the conversations kept


def _copy_attachments(conn: sqlite3.Connection, store: Store, kept: set[int]) -> None:
    """The attached documents (version 4) of the messages kept, where they read; a database before version 4,
    or damage in these tables, leaves the messages without their attachments rather than lost."""
    documents = ("sha256", "size", "media_kind", "encoding", "text", "created")
    links = ("message_id", "idx", "sha256", "name")
    try:
        docs = conn.execute(f"SELECT {', '.join(documents)} FROM documents").fetchall()
        linked = [row for row in conn.execute(f"SELECT {', '.join(links)} FROM message_attachments") if row[0] in kept]
    except sqlite3.DatabaseError:
        return
    have = {row[0] for row in docs}
    store.insert_rows("documents", documents, docs)
    store.insert_rows("message_attachments", links, [row for row in linked if row[2] in have])


def _has_column(conn: sqlite3.Connection, name: str) -> bool:
    try:
        return any(row[1] == name for row in conn.execute("PRAGMA table_info(conversations)"))
    except sqlite3.DatabaseError:
        return False


def _token_rows(conn: sqlite3.Connection, message_id: int) -> list[tuple]:
    """The unbroken run of readable token rows from index 0, as stored (each checked by decoding it)."""
    out: list[tuple] = []
    try:
        cursor = conn.execute(
            f"SELECT {', '.join(_TOKEN_COLUMNS)} FROM tokens WHERE message_id = ? ORDER BY idx", (message_id,)
        )
        for row in cursor:
            if row[1] != len(out):
                break
            token_from_row(row[1:])  # raises for a damaged record
            out.append(tuple(row))
    except (sqlite3.DatabaseError, ValueError, TypeError, KeyError, IndexError):
        pass
    return out


def _temporary(path: Path, kind: str, title: str, text: str) -> OpenedDatabase:
    log.error("%s: %s", title, text)
    body = f"{text}\n\nYou can go on with a temporary database — nothing you do will be saved — or quit."
    return OpenedDatabase(Store(MEMORY), DatabaseNotice(kind, title, body, path))


def _unusable(path: Path, error: BaseException, what: str = "cannot be opened for writing") -> OpenedDatabase:
    reason = f"{type(error).__name__}: {error}" if not isinstance(error, sqlite3.Error) else str(error)
    return _temporary(path, "unusable", "Cannot use the database", f"The database {path} {what} ({reason}).")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()[:300]
    except OSError:
        return "(no details)"


def _of(n: int, total: int | None) -> str:
    return f"{n:,} of {total:,}" if total is not None and total >= n else f"{n:,}"


def _recovered_text(path: Path, moved: Path, problem: str, s: Salvage) -> str:
    if not s.readable:
        found = "Nothing in it could be read: Logit Lab starts with an empty database."
    else:
        found = (
            f"Recovered into a fresh database: {_of(s.conversations, s.conversations_total)} conversations, "
            f"{_of(s.messages, s.messages_total)} messages and {_of(s.tokens, s.tokens_total)} token records"
            + (f", and {s.settings} settings and presets." if s.settings else ".")
        )
        notes = []
        if s.placeholders:
            notes.append(f"{s.placeholders} conversation(s) lost their title: their messages are under "
                         "'Recovered conversation …'.")
        if s.rerooted:
            notes.append(f"{s.rerooted} message(s) whose earlier message was lost now start a branch of their own.")
        if s.damaged_spots:
            notes.append(f"{s.damaged_spots} damaged spot(s) could not be read.")
        if notes:
            found += "\n" + " ".join(notes)
    return (
        f"The database {path} was damaged ({problem}).\n\n{found}\n\n"
        f"The damaged file was kept, unchanged, at:\n{moved}"
    )
