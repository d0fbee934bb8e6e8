"""The set of saved conversations and which one is open."""

from __future__ import annotations

import logging

from app.state.conversation import Conversation, default_title
from app.state.folders import ALL, FolderChoice, Folders
from app.state.observable import Signal
from app.state.database.store import ConversationRow, Store

log = logging.getLogger(__name__)

LAST_OPEN_KEY = "last_conversation_id"


class Library:
    """Lists, creates, opens, renames and deletes conversations; holds the open one."""

    def __init__(self, store: Store):
        self.store = store
        self.current: Conversation | None = None
        # Conversations opened this session, by id: a generation streaming into one keeps
        # writing to the same object while another is shown, so reopening it shows its tokens.
        self._open: dict[int, Conversation] = {}
        self.list_changed = Signal()  # () titles, order or membership changed
        self.current_changed = Signal()  # (Conversation | None)
        self.folders = Folders(store)  # folders and tags (app/state/folders.py)

    def summaries(self, query: str = "", folder: FolderChoice = ALL, tag: str | None = None) -> list[ConversationRow]:
        """Newest first: those matching `query` (titles and text) in `folder` with `tag` (None: any)."""
        rows = self.store.conversations(query)
        if folder == ALL and tag is None:
            return rows
        kept = self.folders.keep([r.id for r in rows], folder, tag)
        return [r for r in rows if r.id in kept]

    def move_to_folder(self, conversation_id: int, folder_id: int | None) -> None:
        self.folders.move(conversation_id, folder_id)
        self.list_changed.emit()

    def create_folder(self, name: str) -> int:
        folder = self.folders.create(name)
        self.list_changed.emit()
        return folder.id

    def rename_folder(self, folder_id: int, name: str) -> None:
        self.folders.rename(folder_id, name)
        self.list_changed.emit()

    def delete_folder(self, folder_id: int) -> None:
        """Delete a folder; its chats go back to no folder."""
        self.folders.delete(folder_id)
        self.list_changed.emit()

    def set_tag(self, conversation_id: int, tag: str, on: bool) -> None:
        if on:
            self.folders.add_tag(conversation_id, tag)
        else:
            self.folders.remove_tag(conversation_id, tag)
        self.list_changed.emit()

    def new(self, system_prompt: str = "", mode: str = "chat") -> Conversation:
        """Create an empty conversation (a chat, or a notebook: app/state/notebook.py) and open it (an unused empty
        one is reused)."""
        if self.current is not None and not self.current.messages and self.current.system_prompt == system_prompt:
            if self.current.mode != mode:
                self.current.set_mode(mode)
                self.current_changed.emit(self.current)  # the views show the other mode
            return self.current
        row = self.store.create_conversation(default_title(mode), system_prompt, mode)
        conv = Conversation(self.store, row, [])
        self._open[conv.id] = conv
        self._set_current(conv)
        self.list_changed.emit()
        return conv

    def add_unopened(self, title: str, system_prompt: str = "", mode: str = "chat",
                     served: dict | None = None) -> Conversation:
        """A new conversation listed at once but not opened (a request a client sent the window's server): the
        open one stays open, and opening this one later shows the same object, tokens streaming in included."""
        row = self.store.create_conversation(title, system_prompt, mode, served)
        conv = self._open[row.id] = Conversation(self.store, row, [])
        self.list_changed.emit()
        return conv

    def release(self, conversation_id: int) -> None:
        """Let go of a conversation kept in memory that is not open (a served one, written whole): opening it
        later reads it back from the store."""
        if self.current is None or self.current.id != conversation_id:
            self._open.pop(conversation_id, None)

    def open(self, conversation_id: int) -> Conversation:
        if self.current is not None and self.current.id == conversation_id:
            return self.current
        conv = self._open.get(conversation_id)
        if conv is None:
            row = self.store.conversation(conversation_id)
            if row is None:
                raise KeyError(f"no conversation {conversation_id}")
            conv = self._open[conversation_id] = Conversation(self.store, row, self.store.messages(conversation_id))
        self._set_current(conv)
        return conv

    def open_last(self) -> Conversation:
        """The conversation open at the end of the last session, else the newest, else a new one."""
        last = self.store.get_setting(LAST_OPEN_KEY)
        if last is not None and self.store.conversation(int(last)) is not None:
            return self.open(int(last))
        rows = self.summaries()
        return self.open(rows[0].id) if rows else self.new()

    def rename(self, conversation_id: int, title: str) -> None:
        if self.current is not None and self.current.id == conversation_id:
            self.current.set_title(title)  # emits changed -> list_changed
            return
        opened = self._open.get(conversation_id)
        if opened is not None:  # keep the cached object in step, or reopening it shows the old title
            opened.set_title(title)
        else:
            row = self.store.conversation(conversation_id)
            untitled = default_title(row.mode if row is not None else "chat")
            self.store.update_conversation(conversation_id, title=" ".join(title.split()) or untitled)
        self.list_changed.emit()

    def delete(self, conversation_id: int) -> None:
        """Delete a conversation; deleting the open one opens the next newest (or a new one)."""
        self.store.delete_conversation(conversation_id)
        gone = self._open.pop(conversation_id, None)
        if gone is not None:
            gone.deleted = True
        if self.current is not None and self.current.id == conversation_id:
            self.current = None
            rows = self.summaries()
            if rows:
                self.open(rows[0].id)
            else:
                self.new()
        self.list_changed.emit()

    def _set_current(self, conv: Conversation) -> None:
        if self.current is not None:
            self.current.flush()
            self.current.changed.disconnect(self._on_conversation_changed)
            self.current.path_changed.disconnect(self._on_conversation_changed)
        self.current = conv
        conv.changed.connect(self._on_conversation_changed)
        conv.path_changed.connect(self._on_conversation_changed)
        self.store.put_setting(LAST_OPEN_KEY, conv.id)
        self.current_changed.emit(conv)

    def _on_conversation_changed(self) -> None:
        self.list_changed.emit()
