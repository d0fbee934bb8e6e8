"""A conversation is a tree of messages; the window shows one path through it.

Every message remembers which of its children is active (`active_child_id`),
and the conversation which root is; the visible path starts at the active
root and follows active children. Regenerating, editing a user message or
branching from a token adds a sibling and makes it active; the "2 / 3"
arrows switch the parent's active child. Structure changes are written
through to the store at once; streamed tokens are buffered and written by
`flush()` (the controller calls it a few times a second and at the end).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from engine import LazyTuple, TokenEvent
from engine import documents

from app.state.observable import Signal
from app.state.database.store import ConversationRow, MessageRow, Store

log = logging.getLogger(__name__)

DEFAULT_TITLE = "New chat"
DEFAULT_TITLES = {"chat": DEFAULT_TITLE, "notebook": "New notebook"}  # an empty conversation's title, by mode


def default_title(mode: str) -> str:
    return DEFAULT_TITLES.get(mode, DEFAULT_TITLE)
TITLE_CHARS = 60


@dataclass(eq=False)
class Message:
    """One message. Assistant messages carry their token records (loaded lazily from the store)."""

    id: int
    parent_id: int | None
    role: str  # "user" | "assistant"
    content: str
    created: float
    active_child_id: int | None = None
    finish_reason: str | None = None  # None: still generating, or cut off by a crash
    branch_index: int | None = None  # a branch: the token index whose alternative was forced
    request: dict[str, Any] | None = None  # the generation options and sampler used
    model: dict[str, Any] | None = None  # the model that wrote it (ModelInfo fields)
    stats: dict[str, Any] | None = None  # GenerationStats of the last run on it
    tokens: list[TokenEvent] | None = field(default=None, repr=False)  # None until loaded
    # Files attached to a user message (docs/documents.md): `content` is what the user typed; the model reads
    # `model_text()`, the attachments' blocks and then the content.
    attachments: list[documents.Attachment] = field(default_factory=list)
    generating: bool = False
    # Stored fields that could not be read (a wrong type, from an older version's import): they read as None,
    # and this says which and why, for the view to show instead of failing (app/state/database/message_fields.py).
    unreadable: str | None = None

    def model_text(self) -> str:
        """The message as the model reads it: with its attachments inserted (engine/documents/compose.py)."""
        return documents.compose_message(self.content, self.attachments).text if self.attachments else self.content

    @property
    def is_assistant(self) -> bool:
        return self.role == "assistant"

    @property
    def can_continue(self) -> bool:
        """A cut-off answer (length, cancelled, interrupted) can be continued."""
        return self.is_assistant and not self.generating and self.finish_reason in (None, "length", "cancelled")

    @classmethod
    def from_row(cls, row: MessageRow) -> "Message":
        return cls(
            id=row.id,
            parent_id=row.parent_id,
            role=row.role,
            content=row.content,
            created=row.created,
            active_child_id=row.active_child_id,
            finish_reason=row.finish_reason,
            branch_index=row.branch_index,
            request=row.request,
            model=row.model,
            stats=row.stats,
            unreadable=row.unreadable,
        )


class Conversation:
    """A message tree plus title and system prompt, observable and persisted."""

    def __init__(self, store: Store, row: ConversationRow, rows: list[MessageRow] | None = None):
        self._store = store
        self.id = row.id
        self.title = row.title
        self.system_prompt = row.system_prompt
        self.created = row.created
        self.active_root_id = row.active_root_id
        self.mode = row.mode  # "chat" | "notebook" (app/state/notebook.py: one text the model continues)
        self.served = row.served  # a client's request to the window's server (app/controllers/served_conversations.py), else None
        self.messages: dict[int, Message] = {r.id: Message.from_row(r) for r in (rows or [])}
        if self.messages:
            for message_id, attached in store.attachments_of(self.id).items():
                if message_id in self.messages:
                    self.messages[message_id].attachments = attached
        # Children by parent, oldest first: an imported loom tree's question has thousands of answers, and
        # the views ask for siblings per answer (a scan of every message each time made that quadratic).
        self._children: dict[int | None, list[Message]] = {}
        for m in sorted(self.messages.values(), key=lambda m: m.id):
            self._children.setdefault(m.parent_id, []).append(m)
        self._pending: dict[int, list[TokenEvent]] = {}  # streamed, not yet written
        self._stages_due: dict[int, list[TokenEvent]] = {}  # written without their stage records (flush)
        self._dirty_content: set[int] = set()
        self.deleted = False  # set by the library; a generation still streaming into it then writes nothing

        self.changed = Signal()  # () title or system prompt
        self.path_changed = Signal()  # () the visible path changed
        self.message_changed = Signal()  # (Message) content, state or stats changed, tokens replaced
        self.tokens_appended = Signal()  # (Message, first new index)

    # -- reading ---------------------------------------------------------------------------

    def children(self, parent_id: int | None) -> list[Message]:
        return list(self._children.get(parent_id, ()))

    def siblings(self, message: Message) -> list[Message]:
        return self.children(message.parent_id)

    def active_child(self, parent_id: int | None) -> Message | None:
        chosen = self.active_root_id if parent_id is None else self.messages[parent_id].active_child_id
        kids = self.children(parent_id)
        if chosen is not None and chosen in self.messages and self.messages[chosen].parent_id == parent_id:
            return self.messages[chosen]
        return kids[-1] if kids else None

    def path(self) -> list[Message]:
        """The visible messages, root first."""
        out: list[Message] = []
        node = self.active_child(None)
        while node is not None:
            out.append(node)
            node = self.active_child(node.id)
        return out

    def ancestry(self, message: Message) -> list[Message]:
        """`message` and its ancestors, root first."""
        chain = [message]
        while chain[-1].parent_id is not None:
            chain.append(self.messages[chain[-1].parent_id])
        return chain[::-1]

    def history(self, upto: Message, include: bool = True) -> list[dict[str, str]]:
        """Chat messages for a request: the system prompt, then `upto`'s ancestry."""
        chain = self.ancestry(upto) if include else self.ancestry(upto)[:-1]
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return head + [{"role": m.role, "content": m.model_text()} for m in chain]

    def tokens(self, message: Message) -> list[TokenEvent]:
        """The token records of `message`, loading them on first use."""
        if message.tokens is None:
            message.tokens = self._store.tokens(message.id) if message.is_assistant else []
        return message.tokens

    # -- structure (written through) -------------------------------------------------------

    def add_message(self, parent: Message | None, role: str, content: str = "", **extra: Any) -> Message:
        """Add a child of `parent` (None: a new root) and make it the active one. `attachments=[Attachment...]`:
        its attached files (an edit or a branch passes the same ones: they are stored once, by their bytes'
        SHA-256); any other keyword is a stored column (Store.insert_message)."""
        attachments: list[documents.Attachment] = list(extra.pop("attachments", ()) or ())
        with self._store.transaction():
            row = self._store.insert_message(self.id, None if parent is None else parent.id, role, content, **extra)
            message = Message.from_row(row)
            message.tokens = []
            if attachments:
                self._store.attach_documents(message.id, attachments)
                message.attachments = list(attachments)
            self.messages[message.id] = message
            self._children.setdefault(message.parent_id, []).append(message)  # ids only grow: stays sorted
            self._activate(message)
            retitled = self.title in DEFAULT_TITLES.values() and role == "user" and bool(content.strip())
            if retitled:
                self._set_title(_title_from(content))
        self.path_changed.emit()
        if retitled:
            self.changed.emit()
        return message

    def select_sibling(self, message: Message, offset: int) -> Message:
        """Show the sibling `offset` places away (clamped); returns the one now shown."""
        sibs = self.siblings(message)
        i = max(0, min(len(sibs) - 1, sibs.index(message) + offset))
        target = sibs[i]
        if target is not message:
            with self._store.transaction():
                self._activate(target)
            self.path_changed.emit()
        return target

    def show(self, message: Message) -> None:
        """Make `message` and its ancestors the active ones, so the visible path runs through it (the loom)."""
        chain = self.ancestry(message)
        if self.path()[: len(chain)] == chain:
            return
        with self._store.transaction():
            for m in chain:
                self._activate(m)
        self.path_changed.emit()

    def _activate(self, message: Message) -> None:
        if message.parent_id is None:
            self.active_root_id = message.id
            self._store.update_conversation(self.id, active_root_id=message.id)
        else:
            self.messages[message.parent_id].active_child_id = message.id
            self._store.update_message(message.parent_id, active_child_id=message.id)

    def set_title(self, title: str) -> None:
        title = " ".join(title.split()) or default_title(self.mode)
        if title != self.title:
            self._set_title(title)
            self.changed.emit()

    def _set_title(self, title: str) -> None:
        self.title = title
        self._store.update_conversation(self.id, title=title)

    def set_mode(self, mode: str) -> None:
        """Make an empty conversation a chat or a notebook (one with messages keeps its mode: its text would
        read differently)."""
        if mode == self.mode:
            return
        if self.messages:
            raise ValueError("only an empty conversation can change between chat and notebook: start a new one")
        self._store.update_conversation(self.id, mode=mode)
        if self.title == default_title(self.mode):  # an untitled chat becomes an untitled notebook, and back
            self._set_title(default_title(mode))
        self.mode = mode
        self.changed.emit()

    def set_text(self, message: Message, content: str) -> None:
        """Replace the text of a message the person wrote (a notebook's typed part, before anything follows it)."""
        if message.is_assistant:
            raise ValueError("a generated part keeps its text: its tokens say what the model wrote")
        with self._store.transaction():
            self._store.update_message(message.id, content=content)
            self._store.touch_conversation(self.id)
        message.content = content
        self.message_changed.emit(message)

    def set_system_prompt(self, text: str) -> None:
        if text != self.system_prompt:
            self.system_prompt = text
            self._store.update_conversation(self.id, system_prompt=text)
            self.changed.emit()

    # -- streaming -------------------------------------------------------------------------

    def append_tokens(self, message: Message, events: list[TokenEvent]) -> None:
        """Add streamed tokens (indices already relative to the message); written on `flush()`."""
        if not events:
            return
        tokens = self.tokens(message)
        start = len(tokens)
        tokens.extend(events)
        message.content += "".join(ev.text for ev in events)
        self._pending.setdefault(message.id, []).extend(events)
        self._dirty_content.add(message.id)
        self.tokens_appended.emit(message, start)

    def set_tokens(self, message: Message, events: list[TokenEvent], content: str) -> None:
        """Give a fresh message its inherited tokens at once (the kept part of a branch)."""
        message.tokens = list(events)
        message.content = content
        self._pending.setdefault(message.id, []).extend(events)
        self._dirty_content.add(message.id)
        self.message_changed.emit(message)

    def update_message(self, message: Message, **fields: Any) -> None:
        """Change stored fields (finish_reason, stats, request, model) and tell the views."""
        for key, value in fields.items():
            setattr(message, key, value)
        with self._store.transaction():
            self._store.update_message(message.id, **fields)
            self._store.touch_conversation(self.id)
        self.message_changed.emit(message)

    def set_generating(self, message: Message, generating: bool) -> None:
        message.generating = generating
        self.message_changed.emit(message)

    def flush(self, *, defer_stages: bool = False) -> int:
        """Write buffered tokens and message text in one transaction; returns how many tokens.

        `defer_stages` (while an answer streams): a token whose stage records the engine has not built yet
        (a `LazyTuple` no one has read: engine.lazy_tuple) is written without them now and again, with them,
        by the next flush without `defer_stages` (the answer's end), so that building them is not paid while the
        model runs on every core. A crash in between keeps the tokens and loses only those tokens' stage records.
        """
        if self.deleted:
            self._pending.clear()
            self._dirty_content.clear()
            self._stages_due.clear()
        if not defer_stages:
            for message_id, events in self._stages_due.items():
                self._pending.setdefault(message_id, []).extend(events)
            self._stages_due.clear()
        if not self._pending and not self._dirty_content:
            return 0
        written = 0
        with self._store.transaction():
            for message_id, events in self._pending.items():
                if defer_stages:
                    due = [ev for ev in events if isinstance(ev.stages, LazyTuple) and not ev.stages.built]
                    if due:
                        self._stages_due.setdefault(message_id, []).extend(due)
                        later = {id(ev) for ev in due}  # by identity: == would build the records
                        events = [replace(ev, stages=None) if id(ev) in later else ev for ev in events]
                self._store.write_tokens(message_id, events)
                written += len(events)
            for message_id in self._dirty_content:
                self._store.update_message(message_id, content=self.messages[message_id].content)
        self._pending.clear()
        self._dirty_content.clear()
        return written

    def write_due_stages(self, budget_s: float) -> bool:
        """Build and write, in one transaction, the stage records `flush(defer_stages=True)` left out, for about
        `budget_s` of building (at least one token's); True while some are left. The window calls it in slices
        when an answer has ended, so a long answer's records do not hold the UI thread at once. A failed write
        keeps them due, in order (the next slice, or any `flush()`, writes them)."""
        if self.deleted:
            self._stages_due.clear()
            return False
        deadline = time.perf_counter() + budget_s
        taken: dict[int, list[TokenEvent]] = {}
        for message_id, events in self._stages_due.items():
            n = 0
            while n < len(events) and (n == 0 and not taken or time.perf_counter() < deadline):
                stages = events[n].stages
                if isinstance(stages, LazyTuple):
                    stages.get()  # built now, within the budget (the write then only reads them)
                n += 1
            if n:
                taken[message_id] = events[:n]
            if n < len(events):
                break
        with self._store.transaction():
            for message_id, events in taken.items():
                self._store.write_tokens(message_id, events)
        for message_id, events in taken.items():
            left = self._stages_due[message_id][len(events):]
            if left:
                self._stages_due[message_id] = left
            else:
                del self._stages_due[message_id]
        return bool(self._stages_due)

    @property
    def has_due_stages(self) -> bool:
        """Tokens written without their stage records, which `write_due_stages` or `flush()` still writes."""
        return bool(self._stages_due)

    @property
    def has_unsaved_tokens(self) -> bool:
        return bool(self._pending or self._stages_due)


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"
