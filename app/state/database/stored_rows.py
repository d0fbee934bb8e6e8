"""Rows of the database as typed values, readable past what an older version or a hostile import stored.

`Store` and the recovery (app/state/database/recovery.py) both read rows through here: a field of the wrong type
reads as None with a note (`MessageRow.unreadable`), never as a list where a mapping belongs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from app.state.database.message_fields import is_int, is_number, readable_fields

log = logging.getLogger(__name__)

MODES = ("chat", "notebook")


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float
    active_root_id: int | None
    mode: str = "chat"  # "chat" | "notebook" (app/state/notebook.py); databases before version 2 hold chats only
    # The request a client sent the window's server (Model ▸ Serve…: id, client, time, endpoint, settings),
    # None for the window's own conversations (all of them before version 3). app/controllers/served_conversations.py
    served: dict[str, Any] | None = None


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
    # Fields that were stored with a wrong type (an older version's import wrote a list as `model`, text as
    # `stats`...): read as None, and this says which and why, so the window can say it rather than fail.
    unreadable: str | None = None


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def message_from_row(r: tuple[Any, ...]) -> MessageRow:
    """A `messages` row as typed values. A field of the wrong type (app/state/database/message_fields.py) reads as None,
    with `unreadable` saying why: the message still shows, and nothing downstream meets a list for a mapping."""
    if r[3] not in ("user", "assistant"):
        raise ValueError(f"unknown role {r[3]!r}")
    if not is_int(r[0]) or not is_int(r[1]) or (r[2] is not None and not is_int(r[2])):
        raise ValueError(f"message {r[0]!r} has no usable id")
    raw: dict[str, Any] = {"finish_reason": r[7], "branch_index": r[8]}
    notes: list[str] = []
    for name, text in (("request", r[9]), ("model", r[10]), ("stats", r[11])):
        try:
            raw[name] = _loads(text)
        except (ValueError, RecursionError) as e:  # not JSON, or JSON nested past what the parser takes
            raw[name] = None
            notes.append(f"{name} is not readable JSON ({type(e).__name__})")
    fields, problem = readable_fields(raw)
    if problem:
        notes.append(problem)
    content = r[4] if isinstance(r[4], str) else ("" if r[4] is None else str(r[4]))
    created = float(r[5]) if is_number(r[5]) else 0.0
    active = r[6] if is_int(r[6]) else None
    unreadable = "; ".join(notes) or None
    if unreadable:
        log.warning("message %s: %s (left out)", r[0], unreadable)
    return MessageRow(r[0], r[1], r[2], r[3], content, created, active, fields["finish_reason"],
                      fields["branch_index"], fields["request"], fields["model"], fields["stats"], unreadable)


def conversation_from_row(r: tuple[Any, ...]) -> ConversationRow:
    if not isinstance(r[1], str):
        raise TypeError("conversation without a title")
    if len(r) > 6 and r[6] not in MODES:
        raise ValueError(f"unknown conversation mode {r[6]!r}")
    return ConversationRow(r[0], r[1], r[2], r[3], r[4], r[5], mode=r[6] if len(r) > 6 else "chat",
                           served=_served(r[7]) if len(r) > 7 else None)


def _served(text: Any) -> dict[str, Any] | None:
    """A conversation's served record; one that cannot be read is left out (the conversation still opens)."""
    if text is None:
        return None
    try:
        doc = json.loads(text) if isinstance(text, (str, bytes)) else None
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        log.warning("a conversation's served record is not readable; it shows as a chat")
        return None
    return doc
