"""Folders and tags for conversations: their tables, and reading them past foreign or damaged rows.

A conversation is in at most one folder (or none) and has any number of tags. Both live in tables of their
own (schema version 5), beside `conversations`, so a database of version 4 keeps every chat as it was: its
chats are simply in no folder and untagged. Deleting a folder deletes only the links to it: its chats go
back to no folder, nothing else is lost. Deleting a conversation deletes its links (ON DELETE CASCADE).

Reads never stop the sidebar from loading: a folder row whose values are not a folder (a name that is not
text, bad UTF-8, an id that is not a number) is skipped and reported through the store's `damaged` signal,
as a preset is; a link to a folder that is not there (written by another tool with foreign keys off) is
read as no folder.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from app.state.database.row_reader import ROW_ERRORS, read_past_damage

if TYPE_CHECKING:  # the store imports this module's schema
    from app.state.database.store import Store

log = logging.getLogger(__name__)

TABLES = ("folders", "conversation_folders", "conversation_tags")

# Which chats the sidebar lists: every one, those in no folder, or those in one folder (its id).
FolderChoice = int | Literal["all", "none"]
ALL: FolderChoice = "all"
NONE: FolderChoice = "none"
NAME_LIMIT = 80  # characters of a folder's name or a tag: a sidebar row, not a document


@dataclass(frozen=True)
class Folder:
    id: int
    name: str


def clean_name(text: str, what: str = "a folder") -> str:
    """`text` with its whitespace runs made single spaces; a ValueError in words when nothing is left or it is too long."""
    name = " ".join(str(text).split())
    if not name:
        raise ValueError(f"{what} needs a name")
    if len(name) > NAME_LIMIT:
        raise ValueError(f"{what}'s name is {len(name)} characters; at most {NAME_LIMIT}")
    return name


def _folder_from_row(row: tuple[Any, ...]) -> Folder:
    folder_id, name = row
    if not isinstance(folder_id, int) or not isinstance(name, str) or not name.strip():
        raise TypeError(f"not a folder: id {folder_id!r}, name {name!r}")
    return Folder(folder_id, name)


def _link_from_row(row: tuple[Any, ...]) -> tuple[int, Any]:
    conversation_id, folder_id = row
    if not isinstance(conversation_id, int):
        raise TypeError(f"not a conversation id: {conversation_id!r}")
    return conversation_id, folder_id


def _tag_from_row(row: tuple[Any, ...]) -> tuple[int, str]:
    conversation_id, tag = row
    if not isinstance(conversation_id, int) or not isinstance(tag, str) or not tag.strip():
        raise TypeError(f"not a tag: conversation {conversation_id!r}, tag {tag!r}")
    return conversation_id, tag


class Folders:
    """The folders and tags of one store's conversations (writes go through the store's own plumbing, so a
    write lock held elsewhere raises DatabaseBusy as every other write does)."""

    def __init__(self, store: Store):
        self._store = store

    def _conn(self) -> sqlite3.Connection:
        return self._store._conn

    def _report(self, what: str, damaged: int, error: str | None) -> None:
        if damaged:
            self._store._damage(f"{damaged} {what} could not be read", error)

    # -- folders ---------------------------------------------------------------------------------------

    def all(self) -> list[Folder]:
        """Every readable folder, by name (case-insensitive)."""
        read = read_past_damage(self._conn(), "folders", "id, name", _folder_from_row)
        self._report("folder row(s)", read.damaged, read.first_error)
        return sorted(read.rows, key=lambda f: (f.name.casefold(), f.id))

    def create(self, name: str) -> Folder:
        name = self._unused(clean_name(name))
        cur = self._store._write("INSERT INTO folders(name, created) VALUES (?, ?)", (name, time.time()))
        if cur.lastrowid is None:
            raise sqlite3.DatabaseError("the database did not report the new folder's id")
        return Folder(cur.lastrowid, name)

    def _unused(self, name: str, keep: int | None = None) -> str:
        """`name`, or "name 2", "name 3"… when another folder has it already (told apart in the sidebar)."""
        taken = {f.name.casefold() for f in self.all() if f.id != keep}
        candidate, n = name, 1
        while candidate.casefold() in taken:
            n += 1
            candidate = f"{name} {n}"
        return candidate

    def rename(self, folder_id: int, name: str) -> str:
        """Rename a folder; returns the name it got (made unique as `create` does)."""
        name = self._unused(clean_name(name), keep=folder_id)
        self._store._write("UPDATE folders SET name = ? WHERE id = ?", (name, folder_id))
        return name

    def delete(self, folder_id: int) -> None:
        """Delete a folder: its chats go back to no folder (the links are deleted even where another tool
        turned foreign keys off), every chat stays."""
        with self._store.transaction():
            self._store._write("DELETE FROM conversation_folders WHERE folder_id = ?", (folder_id,))
            self._store._write("DELETE FROM folders WHERE id = ?", (folder_id,))

    # -- which chat is in which folder -------------------------------------------------------------------

    def assignments(self, folders: list[Folder] | None = None) -> dict[int, int]:
        """Conversation id -> folder id, for the links whose folder exists (another is read as no folder)."""
        known = {f.id for f in (self.all() if folders is None else folders)}
        read = read_past_damage(self._conn(), "conversation_folders", "conversation_id, folder_id", _link_from_row)
        self._report("folder link(s)", read.damaged, read.first_error)
        out: dict[int, int] = {}
        for conversation_id, folder_id in read.rows:
            if isinstance(folder_id, int) and folder_id in known:
                out[conversation_id] = folder_id
            else:
                log.warning("conversation %s names folder %r, which is not there: read as no folder",
                            conversation_id, folder_id)
        return out

    def folder_of(self, conversation_id: int) -> int | None:
        return self.assignments().get(conversation_id)

    def move(self, conversation_id: int, folder_id: int | None) -> None:
        """Put a conversation into a folder (None: into no folder)."""
        if folder_id is None:
            self._store._write("DELETE FROM conversation_folders WHERE conversation_id = ?", (conversation_id,))
            return
        if folder_id not in {f.id for f in self.all()}:
            raise ValueError("that folder is not there any more (deleted in the meantime?)")
        self._store._write(
            "INSERT INTO conversation_folders(conversation_id, folder_id) VALUES (?, ?) "
            "ON CONFLICT(conversation_id) DO UPDATE SET folder_id = excluded.folder_id", (conversation_id, folder_id))

    # -- tags ----------------------------------------------------------------------------------------------

    def tag_map(self) -> dict[int, list[str]]:
        """Conversation id -> its tags, sorted (case-insensitive)."""
        read = read_past_damage(self._conn(), "conversation_tags", "conversation_id, tag", _tag_from_row)
        self._report("tag row(s)", read.damaged, read.first_error)
        out: dict[int, list[str]] = {}
        for conversation_id, tag in read.rows:
            out.setdefault(conversation_id, []).append(tag)
        return {k: sorted(set(v), key=str.casefold) for k, v in out.items()}

    def tags_of(self, conversation_id: int) -> list[str]:
        return self.tag_map().get(conversation_id, [])

    def all_tags(self) -> list[str]:
        return sorted({t for tags in self.tag_map().values() for t in tags}, key=str.casefold)

    def add_tag(self, conversation_id: int, tag: str) -> str:
        """Tag a conversation; an existing tag spelt in another case is reused. Returns the tag given."""
        tag = clean_name(tag, "a tag")
        tag = next((t for t in self.all_tags() if t.casefold() == tag.casefold()), tag)
        self._store._write("INSERT OR IGNORE INTO conversation_tags(conversation_id, tag) VALUES (?, ?)",
                           (conversation_id, tag))
        return tag

    def remove_tag(self, conversation_id: int, tag: str) -> None:
        self._store._write("DELETE FROM conversation_tags WHERE conversation_id = ? AND tag = ?", (conversation_id, tag))

    # -- what a filter keeps ---------------------------------------------------------------------------------

    def keep(self, ids: list[int], folder: FolderChoice, tag: str | None) -> set[int]:
        """Those of `ids` in `folder` (ALL: any, NONE: none) that carry `tag` (None: any)."""
        kept = set(ids)
        if folder != ALL:
            where = self.assignments()
            kept = {i for i in kept if where.get(i) == (None if folder == NONE else folder)}
        if tag is not None:
            tags = self.tag_map()
            kept = {i for i in kept if tag in tags.get(i, [])}
        return kept


def export_fields(store: Store, conversation_id: int) -> dict[str, Any]:
    """A conversation's folder (its name, or None) and tags, for the exports."""
    folders = Folders(store)
    try:
        listed = folders.all()
        folder_id = folders.assignments(listed).get(conversation_id)
        name = next((f.name for f in listed if f.id == folder_id), None)
        return {"folder": name, "tags": folders.tags_of(conversation_id)}
    except ROW_ERRORS as e:  # the export goes on without them; the log says why
        log.warning("the folder and tags of conversation %s could not be read: %s", conversation_id, e)
        return {"folder": None, "tags": []}


def salvage(conn: sqlite3.Connection, store: Store, conversation_ids: set[int]) -> None:
    """Copy the readable folders, and the links and tags of the conversations kept, from a damaged database
    into the fresh `store` (app/state/database/recovery.py); a database before version 5 has none to copy."""
    if not {"folders", "conversation_folders", "conversation_tags"} <= _table_names(conn):
        return
    kept = read_past_damage(conn, "folders", "id, name", _folder_from_row).rows
    known = {f.id for f in kept}
    links = [(c, f) for c, f in read_past_damage(conn, "conversation_folders", "conversation_id, folder_id",
                                                 _link_from_row).rows if c in conversation_ids and f in known]
    tags = [(c, t) for c, t in read_past_damage(conn, "conversation_tags", "conversation_id, tag", _tag_from_row).rows
            if c in conversation_ids]
    now = time.time()
    store._write("INSERT OR REPLACE INTO folders(id, name, created) VALUES (?, ?, ?)",
                 [(f.id, f.name, now) for f in kept], many=True)
    store._write("INSERT OR REPLACE INTO conversation_folders(conversation_id, folder_id) VALUES (?, ?)", links, many=True)
    store._write("INSERT OR IGNORE INTO conversation_tags(conversation_id, tag) VALUES (?, ?)", tags, many=True)


def _table_names(conn: sqlite3.Connection) -> set[str]:
    try:
        return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        return set()
