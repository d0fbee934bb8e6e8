"""Read SQLite rows past damaged pages: what can be read is returned, what cannot is counted.

A damaged page makes a plain `SELECT` stop with `sqlite3.DatabaseError` halfway
through a table; the rows on later pages are often still reachable by seeking
to a larger rowid (the B-tree descends through other pages). `read_past_damage`
walks a table in rowid order, and after an error probes forward — linearly a
little, then in doubling steps — for the next row it can read. A row whose
values do not convert (text that is not UTF-8, JSON that does not parse) counts
as damaged too. Used by the store for everyday reads and by recovery to copy a
damaged database into a fresh one.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

MIN_ROWID = -(2**63)
_BATCH = 256
# After an unreadable row: try the next 16 rowids one by one (one damaged row), then jump in
# doubling steps past a damaged page (up to 2**40 rowids: further than any table of ours reaches).
_PROBES = tuple(range(1, 17)) + tuple(2**k for k in range(5, 41))
# What a damaged value looks like once read: bad UTF-8 (sqlite3 raises OperationalError, a
# DatabaseError), bad JSON (ValueError), a NULL or a wrong type where a value must be.
ROW_ERRORS = (sqlite3.DatabaseError, ValueError, TypeError, KeyError, IndexError)


@dataclass
class ReadResult(Generic[T]):
    rows: list[T] = field(default_factory=list)
    damaged: int = 0  # unreadable rows or regions met (a damaged page counts once)
    first_error: str | None = None

    def note(self, error: BaseException) -> None:
        self.damaged += 1
        if self.first_error is None:
            self.first_error = f"{type(error).__name__}: {error}"


def read_past_damage(
    conn: sqlite3.Connection,
    table: str,
    columns: str,
    convert: Callable[[tuple[Any, ...]], T],
    where: str = "",
    params: tuple[Any, ...] = (),
) -> ReadResult[T]:
    """Every readable row of a rowid `table` (optionally filtered), in rowid order, through `convert`.

    `columns` is the select list (without rowid); `convert` gets those values and
    may raise one of `ROW_ERRORS` for a row whose values are damaged.
    """
    # NOT INDEXED: walk the table's own B-tree, so a damaged index cannot hide rows.
    query = (
        f"SELECT rowid, {columns} FROM {table} NOT INDEXED WHERE "
        + (f"({where}) AND " if where else "")
        + "rowid >= ? ORDER BY rowid LIMIT ?"
    )
    result: ReadResult[T] = ReadResult()
    next_id: int | None = MIN_ROWID
    while next_id is not None:
        last: int | None = None
        try:
            cursor = conn.execute(query, (*params, next_id, _BATCH))
            count = 0
            for raw in cursor:
                count += 1
                last = int(raw[0])
                try:
                    result.rows.append(convert(tuple(raw[1:])))
                except ROW_ERRORS as e:
                    result.note(e)
            if count < _BATCH:
                return result  # the end of the table
            next_id = last + 1  # type: ignore[operator]  # count > 0 rows read: `last` is set
        except sqlite3.DatabaseError as e:  # a page (or a value sqlite3 could not decode) is damaged
            result.note(e)
            # Our rowids start at 1: a failure before any row was read lies at or after rowid 0.
            failed_at = max(next_id if last is None else last + 1, 0)
            next_id = _probe(conn, query, params, failed_at)
    return result


def _probe(conn: sqlite3.Connection, query: str, params: tuple[Any, ...], failed_at: int) -> int | None:
    """The first rowid at or after `failed_at` + a probe step from which a row reads (None: none left)."""
    for step in _PROBES:
        start = failed_at + step
        try:
            row = conn.execute(query, (*params, start, 1)).fetchone()
        except sqlite3.DatabaseError:
            continue
        return None if row is None else start
    return None


def count_rows(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> int | None:
    """A `SELECT count(*)`, or None when the damage reaches it too."""
    try:
        return int(conn.execute(sql, params).fetchone()[0])
    except sqlite3.DatabaseError:
        return None
